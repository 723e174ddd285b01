"""Sweeps: grids -> distinct cells, the SLURM script, and real sweeps of micro cells."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from hacrl.config import CONFIG_DIR, compose
from hacrl.core.errors import ConfigError
from hacrl.sweep.grid import SWEEP_DIR, Compose, expand
from hacrl.sweep.slurm import render_sbatch


def test_table1_trains_single_agent_methods_once_per_agent() -> None:
    expansion = expand("table1", compose)
    cells = expansion.cells
    # 3 pairs x 3 seeds x (2 single-agent methods x 2 agents + naive) and 3 pairs x 8 seeds x
    # (GSPOx2 x 2 agents + hacpo) asked, plus the base models once; the 4B-Base agent is in two
    # pairs, so its single-agent cells are shared
    assert (expansion.asked, len(cells)) == (3 * 3 * 5 + 3 * 8 * 3 + 6, 108)
    assert Counter(c.method for c in cells) == {"base": 5, "grpo": 15, "gspo": 15,
                                                "gspo_x2": 40, "naive": 9, "hacpo": 24}
    assert len({c.id for c in cells}) == len(cells)
    # every trained method runs paired seeds (scale.seeds at tiny scale); HACPO and GSPOx2,
    # the per-agent claim's, scale.claim_seeds, which hold them
    seeds = {m: sorted({c.seed for c in cells if c.method == m})
             for m in ("grpo", "naive", "gspo_x2", "hacpo")}
    assert seeds == {"grpo": [0, 1, 42], "naive": [0, 1, 42],
                     "gspo_x2": [0, 1, 2, 3, 4, 42, 1337, 3407],
                     "hacpo": [0, 1, 2, 3, 4, 42, 1337, 3407]}
    assert {c.seed for c in cells if c.method == "base"} == {0}
    gspo_4b = [c for c in cells if c.method == "gspo" and c.agents == ["qwen3-4b-base"]]
    assert len(gspo_4b) == 3
    assert all(len(c.agents) == (2 if c.method in ("naive", "hacpo") else 1) for c in cells)
    assert all(c.protocols == ["main"] and c.sweeps == ["table1"] for c in cells)
    # the cell id is the hash the job itself computes
    from hacrl.config import config_hash

    for cell in cells[:4]:
        assert config_hash(compose(cell.overrides)) == cell.id


@pytest.mark.parametrize("cell_id", ["4355196216e7", "0e6620930112", "843811173378", "000000000123"])
@pytest.mark.slow
def test_a_cell_id_that_looks_like_a_number_reaches_its_job_as_written(cell_id: str) -> None:
    """Config hashes are hex: ~0.7% of them read as a float or an int unless quoted, which
    named the job's state file 4.355196216e+16.json while the sweep watched 4355196216e7.json."""
    from dataclasses import replace

    cell = replace(expand("table1", compose).cells[0], id=cell_id)
    cfg = compose(cell.job_overrides())
    assert cfg.cell.id == cell_id and isinstance(cfg.cell.id, str)


def test_expansion_composes_each_set_of_group_choices_once(tmp_path: Path) -> None:
    """Plain values (`seed=1337`) are applied to the config of their group choices composed
    once: the same cells as composing every combination, 3 compositions instead of 15."""
    from dataclasses import asdict

    from hacrl.sweep.grid import composing_once

    asked: list[list[str]] = []

    def noted(overrides: list[str]) -> DictConfig:
        asked.append(overrides)
        return compose(overrides)

    once = composing_once(noted, (SWEEP_DIR,))
    cached, each = expand("seeds", once), expand("seeds", compose)
    assert [asdict(c) for c in cached.cells] == [asdict(c) for c in each.cells]
    assert len(asked) == 3 and len(each.cells) == 25  # 5 seeds x (hacpo + 2 gspo + 2 gspo_x2)
    # a key the config lacks is still Hydra's error, not a value added in memory
    (tmp_path / "typo.yaml").write_text(
        "hydra:\n  sweeper:\n    name: typo\n    grids:\n      - pair: size\n"
        "        method: hacpo\n        algo.alpah: [1, 2]\n")
    dirs = (tmp_path, SWEEP_DIR)
    with pytest.raises(ConfigError, match="algo.alpah"):
        expand("typo", composing_once(compose, dirs), dirs=dirs)


@pytest.mark.slow
def test_a_key_the_command_line_sets_wins_over_the_grids(tmp_path, cli_env, hacrl_cmd,
                                                         sweep_file) -> None:
    """`hacrl sweep NAME seed=5 train.steps=7`: every cell gets the command line's values, over
    a grid's axis (`seed`) and its `fixed` overrides (as Figure 3's `train.steps`)."""
    configs = tmp_path / "configs" / "sweep"
    sweep_file(configs, "cli", "[gspo, hacpo]",
               grids="        seed: [0, 1]\n        fixed: [train.steps=50, algo.alpha=2]\n")
    out = subprocess.run([*hacrl_cmd, "sweep", "cli", f"hydra.searchpath=[file://{configs.parent}]",
                          f"output_root={tmp_path}", "seed=5", "train.steps=7",
                          "pair.name=renamed", "hydra.sweeper.dry_run=true"],
                         env=cli_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    manifest = json.loads((tmp_path / "sweeps" / "cli" / "manifest.json").read_text())
    # what the report lays its tables out by, as this command line composed it
    assert manifest["pairs"]["size"] == {"name": "renamed", "setting": "size",
                                         "agents": ["qwen3-1.7b-base", "qwen3-4b-base"]}
    assert manifest["methods"]["hacpo"] == {"shares_rollouts": True, "trains": True}
    assert manifest["methods"]["gspo"]["shares_rollouts"] is False
    cells = manifest["cells"]
    assert len(cells) == 3  # hacpo + gspo per agent, the two grid seeds folded into seed 5
    assert {c["seed"] for c in cells} == {5}
    assert {c["params"]["train.steps"] for c in cells} == {7}
    assert {c["params"]["algo.alpha"] for c in cells} == {2}


@pytest.mark.slow
def test_union_trains_shared_cells_once_and_evaluates_each_protocol(tmp_path: Path) -> None:
    (tmp_path / "union.yaml").write_text(
        "hydra:\n  sweeper:\n    name: union\n    include: [table1, seeds]\n")
    expansion = expand("union", compose, dirs=(tmp_path, SWEEP_DIR))
    cells = {(c.method, tuple(c.agents), c.seed): c for c in expansion.cells}
    # seeds asks 5 seeds x (hacpo + 2 x gspo + 2 x gspo_x2); Table 1 has the size pair's
    # HACPO and GSPOx2 cells of all five (its claim seeds) and its GSPO cells of 0, 1 and 42
    assert expansion.asked == 123 + 25
    assert len(expansion.cells) == 108 + 25 - (5 + 2 * 5 + 2 * 3)
    shared = cells[("gspo", ("qwen3-4b-base",), 0)]
    assert shared.sweeps == ["table1", "seeds"] and shared.protocols == ["main", "ablation"]
    assert cells[("hacpo", ("qwen3-1.7b-base", "qwen3-4b-base"), 1337)].protocols == [
        "main", "ablation"]
    assert cells[("gspo", ("qwen3-4b-base",), 1337)].protocols == ["ablation"]
    # Table 6 reads MATH-500 alone: a seeds-only cell evaluates it alone, a shared one all seven
    assert len(shared.benchmarks) == 7 and "eval.only=[" + ",".join(shared.benchmarks) + "]" \
        in shared.job_overrides()
    only = cells[("gspo", ("qwen3-4b-base",), 1337)]
    assert only.benchmarks == ["tiny_math500"] and "eval.only=[tiny_math500]" in only.job_overrides()
    assert compose(only.job_overrides()).eval.only == ["tiny_math500"]


def test_a_grid_benchmarks_key_names_paper_benchmarks(tmp_path: Path) -> None:
    for value, ok in (("[math500, gsm8k]", True), ("[mmlu]", False), ("[]", False),
                      ("math500", False)):
        (tmp_path / "b.yaml").write_text(
            "hydra:\n  sweeper:\n    name: b\n    grids:\n      - pair: size\n"
            f"        method: hacpo\n        benchmarks: {value}\n")
        if ok:
            (cell,) = expand("b", compose, dirs=(tmp_path, SWEEP_DIR)).cells
            assert cell.benchmarks == ["tiny_math500", "tiny_gsm8k"]
        else:
            with pytest.raises(ConfigError, match=r"sweeps/b.yaml: benchmarks=.*non-empty list"):
                expand("b", compose, dirs=(tmp_path, SWEEP_DIR))


@pytest.mark.slow
def test_a_grid_axis_can_name_a_list_of_the_config(tmp_path: Path) -> None:
    """`seed: ${scale.seeds}` is resolved at the sweep's scale: 3 seeds tiny, 1 paper (and
    `${scale.claim_seeds}` likewise: 8 tiny, 1 paper)."""
    paper = expand("table1", lambda o: compose(["scale=paper", *o])).cells
    assert {c.seed for c in paper} == {0} and len(paper) == 26
    three = expand("table1", lambda o: compose(["scale.seeds=[3,4,5]", "scale.claim_seeds=[6]",
                                                *o])).cells
    assert {c.seed for c in three if c.method == "grpo"} == {3, 4, 5}
    assert {c.seed for c in three if c.method == "hacpo"} == {6}
    (tmp_path / "bad.yaml").write_text(
        "hydra:\n  sweeper:\n    name: bad\n    grids:\n      - pair: size\n"
        "        method: hacpo\n        seed: ${scale.name}\n")
    with pytest.raises(ConfigError, match=r"seed: \$\{scale.name\} must name a non-empty list"):
        expand("bad", compose, dirs=(tmp_path, SWEEP_DIR))


def test_cost_cells_are_timing_repeats_without_evaluation() -> None:
    cells = expand("cost", compose).cells
    assert len(cells) == 7 * 3 and all(c.cost for c in cells)
    repeats = Counter((c.method, tuple(c.agents)) for c in cells)
    assert set(repeats.values()) == {3}
    cfg = compose(cells[0].overrides)
    assert cfg.train.steps == cfg.scale.cost_steps == 10 and cfg.eval.at_end is False
    assert sorted(compose(c.overrides).timing_repeat for c in cells[:3]) == [0, 1, 2]


def _at_scale(scale: str) -> Compose:
    return lambda overrides: compose([f"scale={scale}", *overrides])


def test_figure3_trains_longer_at_every_scale() -> None:
    for scale, steps in (("tiny", 50), ("paper", 150)):
        cell = expand("figure3", _at_scale(scale)).cells[0]
        assert compose([f"scale={scale}", *cell.overrides]).train.steps == steps


def _hydra_compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name="train", overrides=overrides, return_hydra_config=True)


def test_slurm_profile_renders_a_valid_sbatch_script(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HACRL_SLURM_PARTITION", "gpu")
    monkeypatch.setenv("HACRL_SLURM_ACCOUNT", "rl-lab")
    monkeypatch.setenv("HACRL_VENV", "/opt/hacrl/.venv")
    cfg = _hydra_compose(["+sweep=table1", "scale=paper", "launcher=slurm",
                          f"output_root={tmp_path}", "hydra.job.name=hacrl"])
    # the command line's launcher wins over the sweep's local default
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    container = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert isinstance(container, dict)
    launcher = {str(k): v for k, v in container.items()}
    folder = launcher["submitit_folder"]
    assert folder == f"{tmp_path}/sweeps/table1/.submitit/%j"
    script = render_sbatch(launcher, folder, array_size=26)
    lines = set(script.splitlines())
    for flag in ("--partition=gpu", "--account=rl-lab", "--nodes=1", "--ntasks-per-node=1",
                 "--gpus-per-node=8", "--cpus-per-task=64", "--mem=512GB", "--time=1440",
                 "--signal=USR2@300", "--array=0-25%26", "--job-name=hacrl"):
        assert f"#SBATCH {flag}" in lines, flag
    assert "source /opt/hacrl/.venv/bin/activate" in lines
    assert any("submitit.core._submit" in line and line.startswith("srun") for line in lines)
    # preemption / time limit: submitit requeues the job through the launcher's checkpoint
    import submitit
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

    assert launcher["max_num_timeout"] == 20
    params = {k: v for k, v in launcher.items() if k != "_target_"}
    resubmission = SlurmLauncher(**params).checkpoint(["seed=1"], "hydra.sweep.dir", 0, "x", {})
    assert isinstance(resubmission, submitit.helpers.DelayedSubmission)


MINI = """# @package _global_
defaults:
  - override /hydra/sweeper: hacrl
  - override /launcher: local
hydra:
  sweep:
    dir: ${output_root}/sweeps/mini
    subdir: .jobs/${hydra.job.num}
  sweeper:
    name: mini
    report:
      tables: [table2]
    grids:
      - pair: size
        method: [gspo, hacpo]
      - pair: size
        method: hacpo
        # not in the micro zoo: fails its job's validation; the other cells must not care
        agents: ["[qwen3-1.7b-base,qwen3-8b-base]"]
"""


def _client(root: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{root / 'mlflow.db'}")


def _runs(root: Path, query: str) -> list:
    client = _client(root)
    return list(client.search_runs([e.experiment_id for e in client.search_experiments()],
                                   query))


@pytest.mark.slow
def test_sweep_isolates_a_failure_skips_done_cells_and_reports(tmp_path, cli_env, hacrl_cmd,
                                                               new_output_root, tiny_job):
    configs = tmp_path / "configs"
    (configs / "sweep").mkdir(parents=True)
    (configs / "sweep" / "mini.yaml").write_text(MINI)
    root = new_output_root()
    args = [*hacrl_cmd, "sweep", "mini", f"hydra.searchpath=[file://{configs}]",
            f"output_root={root}", *tiny_job]
    first = subprocess.run(args, env=cli_env(root), capture_output=True, text=True, timeout=600)
    assert first.returncode != 0, first.stdout + first.stderr
    rows = json.loads((root / "sweeps" / "mini" / "status.json").read_text())["rows"]
    assert Counter(r["status"] for r in rows) == {"done": 3, "failed": 1}, first.stderr
    (failed,) = [r for r in rows if r["status"] == "failed"]
    assert "agents[1]=qwen3-8b-base: no model at" in failed["error"]
    assert "4 cells asked, 4 distinct" in first.stderr
    assert "failed" in first.stdout and failed["cell"] in first.stdout
    jobs = _runs(root, "tags.`hacrl.kind` = 'job'")
    assert len(jobs) == 3 and {r.info.status for r in jobs} == {"FINISHED"}
    assert {r.data.tags["hacrl.cell"] for r in jobs} == {r["cell"] for r in rows
                                                         if r["status"] == "done"}
    assert all(Path(r["log"]).is_file() for r in rows)
    # each cell's log reads as its story: progress, validation, final scores (or the error),
    # without third-party progress bars
    done_log = Path(next(r["log"] for r in rows if r["status"] == "done")).read_text()
    for line in ("step 1/2  reward", "step 2/2  reward", "validation at step 2:", "AVG ",
                 "done in"):
        assert line in done_log, done_log
    assert "it/s]" not in done_log and "Loading weights" not in done_log, done_log
    failed_log = Path(failed["log"]).read_text()
    assert "failed: ConfigError: agents[1]=qwen3-8b-base: no model at" in failed_log, failed_log
    assert not _runs(root, "attributes.status = 'RUNNING'")
    # the UI filters of docs/TRACKING.md are valid MLflow searches, and the jobs one finds the jobs
    page = (Path(__file__).resolve().parents[1] / "docs" / "TRACKING.md").read_text()
    filters = dict(re.findall(r"^\| (.+?) \| ``(.+?)`` \|$", page, re.M))
    assert filters, "the filter table of docs/TRACKING.md"
    for text in filters.values():
        _runs(root, text.replace("table1", "mini"))  # raises on a bad filter
    found = _runs(root, filters["Table 1's jobs"].replace("table1", "mini"))
    assert {r.info.run_id for r in found} == {r.info.run_id for r in jobs}
    assert {r.info.run_name for r in found} == {
        "hacpo · qwen3-1.7b-base+qwen3-4b-base · seed 0", "gspo · qwen3-1.7b-base · seed 0",
        "gspo · qwen3-4b-base · seed 0"}
    # the sweep ended by writing its report, also logged to MLflow
    assert (root / "reports" / "mini-tiny" / "index.html").is_file(), first.stderr
    assert "[hacrl sweep] report:" in first.stderr
    assert len(_runs(root, "tags.`hacrl.kind` = 'report'")) == 1
    # ... and its seed groups (one seed each here): every job nested under its group's run
    assert "[hacrl sweep] seed groups: 3 group runs in MLflow (3 written" in first.stderr
    groups = {r.info.run_id for r in _runs(root, "tags.`hacrl.kind` = 'seed_group'")}
    assert len(groups) == 3 and {r.data.tags["mlflow.parentRunId"] for r in jobs} == groups

    # again: finished cells are skipped (nothing retrained), the failed one is tried again
    second = subprocess.run(args, env=cli_env(root), capture_output=True, text=True, timeout=600)
    assert second.returncode != 0
    assert "3 done already" in second.stderr
    rows = json.loads((root / "sweeps" / "mini" / "status.json").read_text())["rows"]
    assert Counter(r["status"] for r in rows) == {"skipped": 3, "failed": 1}
    assert len(_runs(root, "tags.`hacrl.kind` = 'job'")) == 3
    assert "seed groups: 3 group runs in MLflow (0 written, 3 unchanged)" in second.stderr
    assert {r.info.run_id for r in _runs(root, "tags.`hacrl.kind` = 'seed_group'")} == groups

    status = subprocess.run([*hacrl_cmd, "status", "mini", f"output_root={root}"],
                            env=cli_env(root), capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    assert "mini: 3 done, 0 running, 0 pending, 1 failed (4 cells" in status.stdout


@pytest.mark.slow
def test_a_cell_evaluated_on_fewer_benchmarks_is_evaluated_again_for_a_sweep_that_reads_all(
        tmp_path, cli_env, hacrl_cmd, new_output_root, tiny_job, sweep_file):
    configs = tmp_path / "configs" / "sweep"
    sweep_file(configs, "one", "hacpo").write_text(
        sweep_file(configs, "one", "hacpo").read_text() + "        benchmarks: [gsm8k]\n")
    sweep_file(configs, "all", "hacpo")
    root = new_output_root()

    def sweep(name: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([*hacrl_cmd, "sweep", name, f"hydra.searchpath=[file://{configs.parent}]",
                              f"output_root={root}", *tiny_job], env=cli_env(root),
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        return out

    def agents() -> list:
        return _runs(root, "tags.`hacrl.kind` = 'agent'")

    sweep("one")
    assert len(agents()) == 2
    for run in agents():  # eval.only: GSM8K alone, its AIME2025 never evaluated
        assert json.loads(run.data.tags["hacrl.eval.main.benchmarks"]) == ["tiny_gsm8k"]
        assert "eval/main/tiny_gsm8k/acc" in run.data.metrics
        assert not any("aime" in k for k in run.data.metrics)
    assert "1 done already" in sweep("one").stderr
    # a sweep reading every benchmark: the same cell, not trained again but evaluated on both
    second = sweep("all")
    assert "0 done already" in second.stderr
    assert len(_runs(root, "tags.`hacrl.kind` = 'job'")) == 1
    for run in agents():
        assert json.loads(run.data.tags["hacrl.eval.main.benchmarks"]) == ["tiny_gsm8k",
                                                                           "tiny_aime2025"]
        assert "eval/main/tiny_aime2025/acc" in run.data.metrics
    assert "1 done already" in sweep("one").stderr  # all of them covers GSM8K


def test_status_of_a_sweep_never_started_says_how_to_start_it(tmp_path, cli_env, hacrl_cmd):
    out = subprocess.run([*hacrl_cmd, "status", "table2", f"output_root={tmp_path}"],
                         env=cli_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "has not started" in out.stderr and "hacrl sweep table2" in out.stderr


def test_unknown_sweep_is_one_line(tmp_path, cli_env, hacrl_cmd):
    out = subprocess.run([*hacrl_cmd, "sweep", "tabel1"], env=cli_env(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "table1" in out.stderr


def test_sweeps_folder_is_the_sweep_config_group() -> None:
    repo = Path(__file__).resolve().parents[1]
    assert (repo / "sweeps").resolve() == (CONFIG_DIR / "sweep").resolve() == SWEEP_DIR
    assert (repo / "experiments").resolve() == CONFIG_DIR
    names = {p.stem for p in SWEEP_DIR.glob("*.yaml")}
    assert names == {"table1", "table2", "table3", "alpha", "seeds", "cost", "table9", "figure3",
                     "schedules", "paper"}


def test_a_cell_overridden_like_hydra_hashes_like_hydra() -> None:
    """The sweep applies a cell's plain overrides in memory with Hydra's parser: the hash of
    `train.lr=1e-4` (a float to Hydra, the string "1e-4" to YAML) is the job's own."""
    from hacrl.config import config_hash
    from hacrl.sweep.grid import with_values

    for extra in (["train.lr=1e-4"], ["algo.alpha=3", "seed=7"], ["agents=[qwen3-4b-base]"]):
        hydra_made = compose(["pair=size", "method=hacpo", *extra])
        in_memory = with_values(compose(["pair=size", "method=hacpo"]), extra)
        assert config_hash(in_memory) == config_hash(hydra_made), extra
    assert isinstance(with_values(compose([]), ["train.lr=1e-4"]).train.lr, float)


# -- a request SLURM cannot hold: refused before anything is queued -----------------------------

NODES = [{"cpus": 2.0, "mem_gb": 7.8125, "gpus": 0.0}, {"cpus": 4.0, "mem_gb": 16.0, "gpus": 2.0}]


@pytest.mark.parametrize(("launcher", "reason"), [
    ({"cpus_per_task": 4, "mem_gb": 16, "gpus_per_node": 2, "nodes": 2}, None),  # the big node
    ({"cpus_per_task": 2, "tasks_per_node": 2, "mem_gb": 3}, None),  # 4 CPUs in all: fits
    ({"cpus_per_task": 64}, "hydra.launcher.cpus_per_task=64: more than SLURM can give (the job "
     "would pend forever): its largest node has 4 CPUs; set hydra.launcher.cpus_per_task (or "
     "HACRL_SLURM_CPUS) to at most 4"),
    ({"cpus_per_task": 3, "tasks_per_node": 2}, "hydra.launcher.cpus_per_task=3: more than SLURM "
     "can give (the job would pend forever): its largest node has 4 CPUs"),
    ({"mem_gb": 512}, "hydra.launcher.mem_gb=512: more than SLURM can give (the job would pend "
     "forever): its largest node has 16 GB; set hydra.launcher.mem_gb (or HACRL_SLURM_MEM_GB) to "
     "at most 16"),
    ({"gpus_per_node": 8}, "hydra.launcher.gpus_per_node=8: more than SLURM can give (the job "
     "would pend forever): its largest node has 2 GPUs; set hydra.launcher.gpus_per_node (or "
     "HACRL_SLURM_GPUS) to at most 2"),
    ({"gpus_per_node": None, "mem_gb": None, "cpus_per_task": None}, None),  # nothing asked
    ({"nodes": 3}, "hydra.launcher.nodes=3: more than SLURM can give (the job would pend "
     "forever): the partition has 2 nodes; set hydra.launcher.nodes to at most 2"),
])
def test_a_request_no_node_can_hold_names_the_setting(launcher: dict,
                                                      reason: str | None) -> None:
    from hacrl.sweep.slurm import misfit

    got = misfit(launcher, NODES)
    assert (got is None) if reason is None else (got is not None and got.startswith(reason)), got


def test_memory_is_offered_rounded_down_to_a_tenth_of_a_gb() -> None:
    from hacrl.sweep.slurm import misfit

    assert misfit({"mem_gb": 7.8}, NODES[:1]) is None
    got = misfit({"mem_gb": 7.9}, NODES[:1])
    assert got is not None and "its largest node has 7.8 GB" in got and got.endswith("at most 7.8")


def test_partition_nodes_reads_sinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hacrl.sweep.slurm import partition_nodes

    sinfo = tmp_path / "sinfo"
    sinfo.write_text("#!/bin/sh\ncat <<'OUT'\n"
                     "n1|local*|2|8000|(null)\nn2|local*|2|8000|(null)\n"
                     "g1|gpu|64|515000+|gpu:a100:8(S:0-1)\ng1|big|64|515000|gpu:4,gpu:h100:4\n"
                     "bad line\nn3|local*|x|8000|(null)\nOUT\n")
    sinfo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert partition_nodes(None) == [{"cpus": 2.0, "mem_gb": 8000 / 1024, "gpus": 0.0}] * 2
    assert partition_nodes("gpu") == [{"cpus": 64.0, "mem_gb": 515000 / 1024, "gpus": 8.0}]
    assert partition_nodes("big") == [{"cpus": 64.0, "mem_gb": 515000 / 1024, "gpus": 8.0}]
    assert partition_nodes("nope") is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert partition_nodes(None) is None  # no sinfo: sbatch decides


HACRL_SWEEPER = "defaults:\n  - override /hydra/sweeper: hacrl\n"


@pytest.mark.parametrize(("text", "needle"), [
    ("hydra:\n  sweeper:\n    grids: [\n", "not valid YAML (expected the node content"),
    ("- a\n- b\n", "a sweep file is a mapping"),
    ("hydra:\n  sweeper:\n    grids:\n      - pair: size\n", "not a hacrl sweep: its defaults"),
    (HACRL_SWEEPER + "hydra:\n  sweeper:\n    grids: 5\n", "grids must be a list of mappings"),
    (HACRL_SWEEPER + "hydra:\n  sweeper:\n    grids: [a, b]\n", "grids must be a list of mapp"),
    (HACRL_SWEEPER + "hydra:\n  sweeper:\n    include: 5\n", "include must be a list of sweep"),
    (HACRL_SWEEPER + "hydra:\n  sweeper:\n    name: x\n", "hydra.sweeper has no grids"),
], ids=["yaml", "list", "no-sweeper", "grids-5", "grids-scalars", "include-5", "empty"])
def test_a_bad_user_sweep_file_is_one_line_before_hydra_starts(tmp_path, capsys, text, needle):
    from hacrl.cli.main import main

    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "mine.yaml").write_text(text)
    assert main(["sweep", "mine", f"hydra.searchpath=[file://{tmp_path}]",
                 f"output_root={tmp_path / 'out'}"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hacrl: sweep: {tmp_path}/sweep/mine.yaml: ")
    assert needle in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
