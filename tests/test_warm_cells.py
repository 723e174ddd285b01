"""Warm cells (hacrl.sweep.warm): forked from one process, still isolated, same results as cold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf


def _sweep_args(write: Callable[..., Path], tmp_path: Path, hacrl_cmd: list[str], name: str,
                methods: str, root: Path, tiny_job: list[str], *extra: str,
                grids: str = "") -> list[str]:
    configs = tmp_path / f"configs-{name}"
    write(configs / "sweep", name, methods, grids=grids)
    return [*hacrl_cmd, "sweep", name, f"hydra.searchpath=[file://{configs}]",
            f"output_root={root}", *tiny_job, *extra]


def _scores(root: Path) -> dict[tuple[str, str], dict[str, list[tuple[int, float]]]]:
    """Every agent run's metric histories (by config hash and model), wall-clock and memory
    ones left out."""
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return {(r.data.tags.get("config_hash", ""), r.data.tags.get("model", "")):
            {k: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, k))
             for k in r.data.metrics if not k.startswith(("time/", "memory/"))}
            for r in runs if r.data.tags.get("hacrl.kind") == "agent"}


@pytest.mark.slow
def test_a_killed_warm_cell_fails_alone_and_the_next_cells_still_run(
        tmp_path, cli_env, hacrl_cmd, new_output_root, tiny_job, sweep_file):
    root = new_output_root()
    args = _sweep_args(sweep_file, tmp_path, hacrl_cmd, "warmkill", "[gspo, naive, hacpo]",
                       root, tiny_job, "hydra.sweeper.parallel=1")
    sweep = subprocess.Popen(args, env=cli_env(root), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    cells = root / "sweeps" / "warmkill" / "cells"
    victim = None
    while victim is None and sweep.poll() is None:  # pytest-timeout bounds a sweep that hangs
        for path in sorted(cells.glob("*.json")) if cells.is_dir() else []:
            state = json.loads(path.read_text() or "{}")
            if state.get("status") == "running":
                victim = state
                os.kill(int(state["pid"]), signal.SIGKILL)  # as the OOM killer would
                break
        time.sleep(0.2)
    out, err = sweep.communicate(timeout=600)
    assert victim is not None, err
    assert sweep.returncode != 0, err
    assert "(warm: forked from one process" in err
    rows = {r["cell"]: r for r in
            json.loads((root / "sweeps" / "warmkill" / "status.json").read_text())["rows"]}
    assert len(rows) == 4  # gspo trains each agent of the pair alone
    assert rows[victim["cell"]]["status"] in ("failed", "killed")
    others = [r for c, r in rows.items() if c != victim["cell"]]
    assert [r["status"] for r in others] == ["done"] * 3, err
    # each warm cell writes its log next to its state, and the state names it
    for cell, row in rows.items():
        assert row["log"] == str(cells / f"{cell}.log"), row
        assert Path(row["log"]).is_file()


def _first_running(cells: Path, sweep: subprocess.Popen) -> dict:
    while sweep.poll() is None:  # pytest-timeout bounds a sweep that hangs
        for path in sorted(cells.glob("*.json")) if cells.is_dir() else []:
            state = json.loads(path.read_text() or "{}")
            if state.get("status") == "running":
                return state
        time.sleep(0.2)
    raise AssertionError("the sweep ended before any cell started")


def _wait_gone(pid: int) -> None:
    """Returns once the process is gone; while it lives on, the test's timeout ends the wait."""
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


@pytest.mark.slow
def test_a_sweep_killed_outright_takes_its_warm_cells_with_it(tmp_path, cli_env, hacrl_cmd,
                                                             new_output_root, tiny_job,
                                                             sweep_file):
    root = new_output_root()
    args = _sweep_args(sweep_file, tmp_path, hacrl_cmd, "warmgone", "hacpo", root, tiny_job,
                       "train.steps=50")  # long enough to be running when the sweep dies
    sweep = subprocess.Popen(args, env=cli_env(root), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    cells = root / "sweeps" / "warmgone" / "cells"
    running = _first_running(cells, sweep)
    sweep.kill()  # SIGKILL: the sweep runs no cleanup at all
    sweep.wait()
    _wait_gone(int(running["pid"]))  # a cell that outlives its sweep times the test out
    state = json.loads((cells / f"{running['cell']}.json").read_text())
    assert state["status"] == "killed"  # it saw SIGTERM and said so


@pytest.mark.slow
def test_warm_and_cold_cells_log_the_same_scores(tmp_path, cli_env, hacrl_cmd, new_output_root,
                                                 tiny_job, sweep_file, assert_varies):
    scores = {}
    for warm in ("true", "false"):
        root = new_output_root(f"out-{warm}")
        # where the micro models score (conftest's micro_zoo): curves that vary
        args = _sweep_args(sweep_file, tmp_path, hacrl_cmd, "warmcold", "hacpo", root, tiny_job,
                           "task.train_split=tiny_gsm8k", "validation.benchmark=tiny_gsm8k",
                           f"hydra.sweeper.warm={warm}")
        out = subprocess.run(args, env=cli_env(root), capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        assert ("(warm: forked" in out.stderr) == (warm == "true")
        assert "leaked semaphore" not in out.stderr  # cells exit through their finalizers
        scores[warm] = _scores(root)
    assert len(scores["true"]) == 2 and all(scores["true"].values())
    assert scores["true"] == scores["false"]
    agents = scores["true"].values()
    for key in ("reward/mean", "loss/total", "grad_norm", "capability/P", "val/tiny_gsm8k/acc",
                "eval/main/tiny_gsm8k/acc"):
        assert_varies(key, *(curves[key] for curves in agents))


@pytest.mark.slow
def test_timing_cells_run_warm_alone_after_the_others(tmp_path, cli_env, hacrl_cmd,
                                                      new_output_root, tiny_job, sweep_file):
    root = new_output_root()
    cost = "      - pair: size\n        method: hacpo\n        cost:\n          repeats: 2\n"
    args = _sweep_args(sweep_file, tmp_path, hacrl_cmd, "warmcost", "gspo", root, tiny_job,
                       "hydra.sweeper.parallel=2", "hydra.sweeper.cost_threads=2", grids=cost)
    out = subprocess.run(args, env=cli_env(root), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    sweep = root / "sweeps" / "warmcost"
    cells = json.loads((sweep / "manifest.json").read_text())["cells"]
    timing = [c["id"] for c in cells if c["cost"]]
    others = [c["id"] for c in cells if not c["cost"]]
    assert len(timing) == 2 and len(others) == 2  # hacpo x 2 repeats; gspo per agent
    assert "timing cells: 2 alone, one at a time, 2 thread(s)" in out.stderr
    states = {cid: json.loads((sweep / "cells" / f"{cid}.json").read_text()) for cid in timing
              + others}
    assert all(s["status"] == "done" for s in states.values()), states

    def threads(cell: str) -> int:
        run_dir = next(Path(c["run_dir"]) for c in cells if c["id"] == cell)
        return int(OmegaConf.load(run_dir / "config.yaml").engine.threads)

    for cid in timing:
        # warm: forked from the sweep's warm process, whose cells log next to their state (a
        # cold submitit process logs under .submitit/); with the timing cells' thread count
        assert states[cid]["log"] == str(sweep / "cells" / f"{cid}.log"), states[cid]
        assert threads(cid) == 2 and all(threads(o) == 1 for o in others)  # scale=tiny: 1
        # alone: after every other cell ended, and never overlapping another timing cell
        mine = states[cid]
        assert all(mine["started"] >= states[o]["ended"] for o in others), states
        assert all(mine["started"] >= states[t]["ended"] or mine["ended"] <= states[t]["started"]
                   for t in timing if t != cid), states



@pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="Linux's /proc only")
def test_a_forked_child_maps_its_parents_file_pages_and_copies_what_it_shares(tmp_path):
    """A forked child's RSS lacks its parent's file pages (shared libraries) until it touches
    them: map_server_pages maps them, so a warm cell's peak RSS counts them as a cold one's;
    with copy=True (a timing cell) the memory it shares with its parent becomes its own, as a
    cold process's is, with its RSS unchanged."""
    import torch  # noqa: F401 (libtorch's pages: the bulk of a cell's file-backed RSS)

    from hacrl.sweep.warm import map_server_pages

    def kb(field: str, pid: int | str = "self", file: str = "status") -> int:
        line = next(x for x in Path(f"/proc/{pid}/{file}").read_text().splitlines()
                    if x.startswith(f"{field}:"))
        return int(line.split()[1])

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what it has before and after each step, and what its parent has
        try:
            seen = {"file": [kb("RssFile")], "shared": [], "rss": []}
            map_server_pages(os.getppid())
            seen["file"] += [kb("RssFile"), kb("RssFile", os.getppid())]
            seen["shared"].append(kb("Shared_Dirty", file="smaps_rollup"))
            seen["rss"].append(kb("VmRSS"))
            map_server_pages(os.getppid(), copy=True)
            seen["shared"].append(kb("Shared_Dirty", file="smaps_rollup"))
            seen["rss"].append(kb("VmRSS"))
            os.write(write, json.dumps(seen).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen = json.loads(pipe.read())
    os.waitpid(pid, 0)
    before, after, parent = seen["file"]
    assert before < after  # faulted in lazily at first
    assert after >= 0.95 * parent  # then mapped like the parent's
    shared, copied = seen["shared"]
    assert copied < shared / 10, seen  # its own after the copy
    assert abs(seen["rss"][1] - seen["rss"][0]) <= 0.02 * seen["rss"][0], seen


def test_timing_cells_fork_only_where_the_kernel_can_map_their_servers_pages(monkeypatch) -> None:
    import platform

    from hacrl.sweep.warm import populate_supported

    for release, system, ok in (("6.18.44-fc", "Linux", True), ("5.14.0-284.el9", "Linux", True),
                                ("4.18.0-553.el8", "Linux", False), ("23.1.0", "Darwin", False)):
        monkeypatch.setattr(platform, "release", lambda r=release: r)
        monkeypatch.setattr(platform, "system", lambda s=system: s)
        assert populate_supported() is ok, release
