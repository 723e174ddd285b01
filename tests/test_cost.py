"""Measured cost: what a job logs (`hacrl.job.usage`: CPU, GPUs, GPU seconds, money, tokens), the
price table's checks, the report's cost table (`analysis.cost`) on a real sweep's store, and the
cost line of `hacrl status`."""

from __future__ import annotations

import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import torch
from mlflow.tracking import MlflowClient

from hacrl.config import ConfigError, compose, config_hash, validate
from hacrl.config.ranges import refusals
from hacrl.job import run_job
from hacrl.job.usage import Usage, gpu_count, gpu_type, price, take_usage, visible_devices
from hacrl.schema import metric_names as M
from hacrl.schema import tags as T

# -- GPUs from the allocation --------------------------------------------------------------------

SLURM = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[01-02]"}


@pytest.mark.parametrize(("env", "torch_sees", "expected"), [
    ({}, 0, 0),                                             # a CPU machine
    ({}, 2, 2),                                             # nothing said: what torch sees
    ({"CUDA_VISIBLE_DEVICES": "0,1,3"}, 8, 3),              # the visible ones, not the machine's
    ({"CUDA_VISIBLE_DEVICES": ""}, 8, 0),                   # every GPU hidden
    ({"CUDA_VISIBLE_DEVICES": "0,-1,2"}, 8, 1),             # CUDA stops at the first bad entry
    ({"CUDA_VISIBLE_DEVICES": "GPU-8f0e2a1b-aa,MIG-GPU-8f0e2a1b-aa/1/0"}, 8, 2),  # UUIDs
    ({**SLURM, "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_NUM_NODES": "2",
      "CUDA_VISIBLE_DEVICES": "0"}, 1, 8),                  # the allocation: per node x nodes
    ({**SLURM, "SLURM_GPUS_PER_NODE": "h100:4", "SLURM_JOB_NUM_NODES": "1"}, 0, 4),
    ({**SLURM, "SLURM_GPUS_PER_NODE": "gpu:a100:2(S:0-1)"}, 0, 4),  # 2 nodes from the list
    ({**SLURM, "SLURM_JOB_GPUS": "0,1", "SLURM_JOB_NUM_NODES": "1"}, 0, 2),
    ({**SLURM, "SLURM_JOB_NUM_NODES": "1"}, 0, 0),          # a CPU partition
    ({**SLURM, "SLURM_JOB_NUM_NODES": "1", "CUDA_VISIBLE_DEVICES": "0,1"}, 0, 2),
    ({"SLURM_GPUS_ON_NODE": "4"}, 0, 0),                    # not inside a SLURM job
    ({**SLURM, "SLURM_JOB_NUM_NODES": "two", "CUDA_VISIBLE_DEVICES": "1"}, 0, 1),
])
def test_gpu_count_reads_slurm_then_cuda_visible_devices_then_torch(env, torch_sees,
                                                                     expected) -> None:
    assert gpu_count(env, lambda: torch_sees) == expected


def test_visible_devices_counts_entries_cuda_takes() -> None:
    assert [visible_devices(v) for v in ("0", "0,1", "", "-1", "NoDevFiles", "3, 5")] == \
        [1, 2, 0, 0, 0, 2]


def test_gpu_type_is_torchs_name_else_slurms_request() -> None:
    assert gpu_type({}, lambda: "NVIDIA H100 80GB HBM3") == "NVIDIA H100 80GB HBM3"
    assert gpu_type({"SLURM_GPUS_ON_NODE": "gpu:h100:8(S:0-1)"}, lambda: None) == "h100"
    assert gpu_type({"SLURM_GPUS_PER_NODE": "a100:4"}, lambda: None) == "a100"
    assert gpu_type({"SLURM_TRES_PER_NODE": "gres/gpu:l40s:2"}, lambda: None) == "l40s"
    assert gpu_type({"SLURM_GPUS_ON_NODE": "8"}, lambda: None) is None
    assert gpu_type({}, lambda: None) is None


def test_price_matches_the_gpu_name_exactly_else_the_longest_key_inside_it() -> None:
    table = {"H100": 2.0, "h100 80gb": 2.5, "A100": 1.0}
    assert price("NVIDIA H100 80GB HBM3", table) == 2.5
    assert price("NVIDIA H100 PCIe", table) == 2.0
    assert price("a100", table) == 1.0
    assert price("NVIDIA L4", table) is None
    assert price(None, table) is None and price("H100", {}) is None
    usage = Usage(seconds=1800.0, cpu_s=10.0, gpus=2, gpu_type="NVIDIA H100 PCIe")
    assert usage.metrics(table) == {M.CPU_S: 10.0, M.GPUS: 2.0, M.GPU_S: 3600.0, M.USD: 2.0}
    assert M.USD not in usage.metrics({"L4": 1.0})
    assert usage.tags() == {T.GPU_TYPE: "NVIDIA H100 PCIe"}
    cpu = Usage(seconds=1800.0, cpu_s=10.0, gpus=0, gpu_type=None)
    assert cpu.metrics(table) == {M.CPU_S: 10.0, M.GPUS: 0.0, M.GPU_S: 0.0} and cpu.tags() == {}


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_usage_is_counted_once_per_job_and_includes_live_children() -> None:
    cpu_only = {"CUDA_VISIBLE_DEVICES": ""}
    take_usage(cpu_only)  # the span so far belongs to whatever ran before
    _burn(0.3)
    mine = take_usage(cpu_only)
    assert 0.25 <= mine.cpu_s < 0.3 + 1.0 and mine.gpus == 0
    assert mine.seconds >= 0.25
    # a child still running when the job ends: its CPU seconds count too
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + "
                              "0.6\nwhile time.process_time() < end: pass\ntime.sleep(60)"])
    try:
        deadline = time.monotonic() + 60
        while sum(psutil.Process(child.pid).cpu_times()[:2]) < 0.55:
            assert time.monotonic() < deadline, "the child did not burn its CPU second"
            time.sleep(0.05)
        with_child = take_usage(cpu_only)
        assert with_child.cpu_s >= 0.5, with_child
        again = take_usage(cpu_only)  # nothing new: the child's seconds were taken already
        assert again.cpu_s < 0.3, again
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


# -- the price table -------------------------------------------------------------------------------


@pytest.mark.parametrize(("override", "line"), [
    ("+cost.gpu_hour_usd={H100: -1}", "cost.gpu_hour_usd.H100=-1: must be a finite number in "
                                     "[0, 1000000]"),
    ("+cost.gpu_hour_usd={H100: abc}", "cost.gpu_hour_usd.H100=abc: must be a finite number"),
    ("+cost.gpu_hour_usd={A100: .inf}", "cost.gpu_hour_usd.A100="),
    ("+cost.gpu_hour_usd={H100: [1]}", "cost.gpu_hour_usd.H100=[1]: must be a finite number"),
    ("cost.gpu_hour_usd=5", "cost.gpu_hour_usd=5: must be a mapping"),
])
def test_a_bad_price_is_one_line_naming_the_key(override: str, line: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(compose([override]))
    assert len(str(err.value).splitlines()) == 1 and str(err.value).startswith(line), err.value


def test_prices_pass_their_checks_and_change_no_config_hash() -> None:
    priced = compose(["+cost.gpu_hour_usd={H100: 2.5,A100: 0}"])
    assert list(refusals(priced)) == []
    assert dict(priced.cost.gpu_hour_usd) == {"H100": 2.5, "A100": 0}
    assert dict(compose([]).cost.gpu_hour_usd) == {}
    for extra in ([], ["method=gspo"], ["scale=paper"]):
        assert config_hash(compose(extra)) == config_hash(
            compose([*extra, "+cost.gpu_hour_usd={H100: 2.5}"]))


# -- a job's cost metrics --------------------------------------------------------------------------


def _client(root: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")


def _step_sum(client: MlflowClient, run_id: str, key: str) -> float:
    return sum(m.value for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_a_job_logs_its_cost(job_env, new_output_root, tiny_job) -> None:
    root = new_output_root()
    spec = validate(compose([*tiny_job, f"output_root={root}", "+cost.gpu_hour_usd={H100: 3}"]))
    summary = run_job(spec, progress=False)
    live = [p.cpu_times() for p in psutil.Process().children(recursive=True)]
    spent = sum(os.times()[:4]) + sum(t.user + t.system + t.children_user + t.children_system
                                      for t in live)
    client = _client(root)
    job = client.get_run(summary["job_run_id"]).data
    # CPU: more than none, and no more than this process and its children used in all
    assert 0 < job.metrics[M.CPU_S] <= spent + 0.5, (job.metrics[M.CPU_S], spent)
    if not torch.cuda.is_available():  # on a CPU: no GPUs, GPU seconds, money or GPU type
        assert (job.metrics[M.GPUS], job.metrics[M.GPU_S]) == (0.0, 0.0)
        assert M.USD not in job.metrics and T.GPU_TYPE not in job.tags
    else:  # the GPUs torch sees (no SLURM here), for the job process's seconds
        gpus = job.metrics[M.GPUS]
        assert gpus >= 1 and job.tags[T.GPU_TYPE] == torch.cuda.get_device_name(0)
        assert gpus * job.metrics[M.WALL] <= job.metrics[M.GPU_S]
        if "H100" in job.tags[T.GPU_TYPE].upper():
            assert job.metrics[M.USD] == pytest.approx(job.metrics[M.GPU_S] / 3600 * 3)
    sampled = trained = 0.0
    for name, run_id in summary["agent_run_ids"].items():
        agent = client.get_run(run_id).data.metrics
        own = _step_sum(client, run_id, M.TOKENS_OWN)
        borrowed = _step_sum(client, run_id, M.TOKENS_BORROWED)
        assert own > 0 and borrowed > 0, name  # HACPO: each agent borrows its partner's rows
        assert agent[M.TOKENS_SAMPLED] == own, name
        assert agent[M.TOKENS_TRAINED] == own + borrowed, name
        sampled, trained = sampled + own, trained + own + borrowed
    assert (job.metrics[M.TOKENS_SAMPLED], job.metrics[M.TOKENS_TRAINED]) == (sampled, trained)
    assert summary["cost"][M.TOKENS_TRAINED] == trained
    # the seconds and memory stay the job's time/ and memory/ metrics, not copies
    assert M.WALL in job.metrics and M.PEAK_RSS in job.metrics
    assert not [k for k in job.metrics if k.startswith("cost/") and k.endswith("wall_s")]


@pytest.mark.slow
def test_a_base_evaluation_logs_its_wall_cpu_and_priced_gpus(job_env, new_output_root, tiny_job,
                                                             monkeypatch) -> None:
    # as a SLURM job holding two H100s would see it (the evaluation itself runs on the CPU)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "h100:2")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    root = new_output_root()
    spec = validate(compose([*tiny_job, f"output_root={root}", "method=base",
                             "agents=[qwen3-4b-base]", "+cost.gpu_hour_usd={h100: 3,A100: 1}"]))
    summary = run_job(spec, progress=False)
    client = _client(root)
    run = client.get_run(summary["agent_run_ids"]["qwen3-4b-base"]).data
    assert run.tags[T.KIND] == T.EVAL
    assert run.metrics[M.WALL] > 0 and run.metrics[M.CPU_S] > 0 and run.metrics[M.PEAK_RSS] > 0
    assert run.metrics[M.GPUS] == 2.0 and run.tags[T.GPU_TYPE] == "h100"
    # GPU seconds: both GPUs for the evaluation's seconds; money: GPU-hours x the h100 price
    assert run.metrics[M.GPU_S] == pytest.approx(2 * run.metrics[M.WALL])
    assert run.metrics[M.USD] == pytest.approx(run.metrics[M.GPU_S] / 3600 * 3)
    # evaluated again: skipped, and the cost of the evaluation that ran stays
    logged = client.get_metric_history(summary["agent_run_ids"]["qwen3-4b-base"], M.CPU_S)
    run_job(spec, progress=False)
    assert client.get_metric_history(summary["agent_run_ids"]["qwen3-4b-base"], M.CPU_S) == logged


# -- the report's cost table and `hacrl status` on a real sweep ----------------------------------


def test_a_group_sums_its_cells_takes_the_largest_peak_and_says_what_it_lacks() -> None:
    from analysis.cost import PEAK, CellCost, amount, total
    from hacrl.schema.sweep_manifest import CellRecord

    def cell(i: int, missing: dict[str, str], **values: float) -> CellCost:
        record = CellRecord(id=f"c{i}", overrides=[], method="hacpo", agents=["a"], seed=i)
        return CellCost(record, dict(values), missing, [f"r{i}"])

    older = {"cpu_s": "not logged (older run)"}
    group = [cell(0, {}, wall_s=7200.0, cpu_s=10.0, peak_gb=2.0),
             cell(1, older, wall_s=3600.0, peak_gb=3.0),
             cell(2, {}, wall_s=1800.0, cpu_s=20.0, peak_gb=1.0)]
    assert total(group, "wall_s", 3600.0).values == [3.5]
    assert total(group, PEAK).values == [3.0]
    cpu = total(group, "cpu_s")
    assert cpu.values == [30.0] and cpu.reason == "1 of 3 cells not logged (older run)"
    assert total([group[1]], "cpu_s").mean is None  # missing, not 0
    assert total([*group, group[0]], "wall_s").values == [12600.0]  # one run counted once
    assert total([], PEAK).mean is None
    assert [amount("wall_s", 12600.0), amount("cpu_s", 27.4), amount("tokens_trained", 1.25e6),
            amount(PEAK, 0.812), amount("usd", 12.3)] == [
        "3.50 h", "27 s", "1.2M", "0.81 GB", "12.30 USD"]



def _frame(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def _values(frame: pd.DataFrame, section: str, row: str | None = None) -> pd.DataFrame:
    part = frame[frame["section"] == section]
    return part if row is None else part[part["row"] == row]


def _forget_cost(db: Path) -> None:
    """The store as a run from before the cost/ family would have left it."""
    with sqlite3.connect(db) as con:
        for table in ("metrics", "latest_metrics"):
            con.execute(f"DELETE FROM {table} WHERE key LIKE 'cost/%'")
        # ... and a base evaluation run had no wall seconds of its own
        con.execute("DELETE FROM metrics WHERE key = 'time/wall_s' AND run_uuid IN (SELECT "
                    "run_uuid FROM tags WHERE key = 'hacrl.kind' AND value = 'eval')")
        con.execute("DELETE FROM latest_metrics WHERE key = 'time/wall_s' AND run_uuid IN ("
                    "SELECT run_uuid FROM tags WHERE key = 'hacrl.kind' AND value = 'eval')")


@pytest.mark.slow
def test_a_sweeps_cost_table_sums_its_cells_and_status_prints_it(
        tmp_path, cli_env, hacrl_cmd, new_output_root, tiny_job, sweep_file, capsys) -> None:
    from analysis.context import Context
    from analysis.cost import cost_table, status_line
    from analysis.store import open_store
    from hacrl.cli.main import main
    from hacrl.schema.sweep_manifest import read_manifest

    configs = tmp_path / "configs"
    sweep_file(configs / "sweep", "mini", methods="[base, gspo, hacpo]",
               report="    report:\n      tables: [table2]\n")
    root = new_output_root()
    args = [*hacrl_cmd, "sweep", "mini", f"hydra.searchpath=[file://{configs}]",
            f"output_root={root}", *tiny_job]
    done = subprocess.run(args, env=cli_env(root), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = read_manifest(root / "sweeps" / "mini")
    assert manifest is not None and len(manifest.cells) == 5  # base x2, gspo x2, hacpo
    frame = _frame(root / "reports" / "mini-tiny" / "tables" / "cost.csv")
    assert "Measured cost" in (root / "reports" / "mini-tiny" / "index.html").read_text()

    # each cell's row holds what its run logged (seconds: the whole sweep took under an hour)
    client = _client(root)
    cells = _values(frame, "per cell")
    assert len(set(cells["row"])) == 5
    assert {"wall s", "CPU s", "GPU s"} <= set(frame["column"])
    for cell in manifest.cells:
        row = cells[cells["row"].str.endswith(f"({cell.id})")]
        (run_id,) = set(row["run_ids"])
        metrics = client.get_run(run_id).data.metrics
        ours = dict(zip(row["column"], row["ours"], strict=True))
        assert ours["CPU s"] == pytest.approx(metrics[M.CPU_S]) and ours["CPU s"] > 0
        assert ours["GPU s"] == 0.0
        assert ours["wall s"] == pytest.approx(metrics[M.WALL] + metrics.get(M.STARTUP, 0.0))
        if cell.trains:
            assert ours["tokens trained"] == metrics[M.TOKENS_TRAINED] > 0
        else:  # an evaluation trains on nothing: missing, not 0
            assert math.isnan(ours["tokens trained"])
            assert row[row["column"] == "tokens trained"]["missing"].item() == "evaluation only"
    assert "USD" not in set(frame["column"])  # nothing priced

    def summed(part: pd.DataFrame, column: str, how=sum) -> float:
        return how(part[part["column"] == column]["ours"].dropna())

    # a method's row sums its cells (peak memory: their maximum); the total sums them all
    for method in ("base", "gspo", "hacpo"):
        mine = cells[cells["row"].str.startswith(f"{method} ·")]
        (label,) = {r for r in _values(frame, "per method")["row"] if r.startswith(method + " ")}
        group = _values(frame, "per method", label)
        for column in ("wall s", "CPU s", "tokens sampled", "tokens trained"):
            assert summed(group, column) == pytest.approx(summed(mine, column)), (method, column)
        assert summed(group, "peak RSS GB (max)") == pytest.approx(
            summed(mine, "peak RSS GB (max)", max))
    everything = _values(frame, "total")
    for column in ("wall s", "CPU s", "tokens trained"):
        assert summed(everything, column) == pytest.approx(summed(cells, column))
        assert summed(_values(frame, "per sweep file"), column) == pytest.approx(
            summed(cells, column))
    # two base cells lack tokens: the total sums the others and says so
    assert "2 of 5 cells evaluation only" in (root / "reports" / "mini-tiny" / "tables"
                                                / "cost.md").read_text()

    # `hacrl status`: the done cells' total, the same numbers
    capsys.readouterr()
    assert main(["status", "mini", f"output_root={root}"]) == 0
    out = capsys.readouterr().out
    assert f"cost so far (5 cells done): cells' wall {summed(everything, 'wall s'):.0f} s (summed), " \
           f"CPU {summed(everything, 'CPU s'):.0f} s, GPU 0 s, peak RSS " in out, out
    trained = summed(everything, "tokens trained")
    assert 1000 <= trained < 1e6
    assert f"{trained / 1000:.1f}k trained (2 of 5 cells evaluation only)" in out, out
    store = open_store(f"sqlite:///{root / 'mlflow.db'}", "hacrl-tiny")
    ids = [c.id for c in manifest.cells]
    line = status_line(store, manifest.cells, {ids[0]: "done", ids[1]: "running",
                                               ids[2]: "pending", ids[3]: "failed"})
    assert line.startswith("cost so far (1 cell done): ") and \
        line.endswith("; not counted yet: 1 running, 2 pending"), line

    # the same sweep as logged before the cost/ family: wall seconds only, the rest missing
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(root / "mlflow.db", old / "mlflow.db")
    _forget_cost(old / "mlflow.db")
    store = open_store(f"sqlite:///{old / 'mlflow.db'}", "hacrl-tiny")
    ctx = Context(store, manifest.cells, "tiny", manifest.grids or {}, pairs=manifest.pairs or {},
                  methods=manifest.methods or {})
    before = cost_table(ctx).to_frame()
    cells = _values(before, "per cell")
    cpu = cells[cells["column"] == "CPU s"]
    assert cpu["ours"].isna().all() and set(cpu["missing"]) == {"not logged (older run)"}
    walls = cells[cells["column"] == "wall s"]
    assert walls["ours"].notna().all() and (walls["ours"] > 0).all()
    total_cpu = _values(before, "total")
    assert total_cpu[total_cpu["column"] == "CPU s"]["missing"].item() == \
        "5 of 5 cells not logged (older run)"
