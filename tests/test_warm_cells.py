"""Warm cells (hacrl.sweep.warm): forked from one process, still isolated, same results as cold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from mlflow.tracking import MlflowClient


def _sweep_args(write: Callable[..., Path], tmp_path: Path, hacrl_cmd: list[str], name: str,
                methods: str, root: Path, tiny_job: list[str], *extra: str) -> list[str]:
    configs = tmp_path / f"configs-{name}"
    write(configs / "sweep", name, methods)
    return [*hacrl_cmd, "sweep", name, f"hydra.searchpath=[file://{configs}]",
            f"output_root={root}", *tiny_job, *extra]


def _scores(root: Path) -> dict[tuple[str, str], dict[str, float]]:
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return {(r.data.tags.get("config_hash", ""), r.data.tags.get("model", "")):
            {k: v for k, v in r.data.metrics.items() if k.startswith(("eval/", "val/", "train/"))}
            for r in runs if r.data.tags.get("hacrl.kind") == "agent"}


def test_a_killed_warm_cell_fails_alone_and_the_next_cells_still_run(
        tmp_path, cli_env, hacrl_cmd, new_output_root, tiny_job, sweep_file):
    root = new_output_root()
    args = _sweep_args(sweep_file, tmp_path, hacrl_cmd, "warmkill", "[gspo, naive, hacpo]",
                       root, tiny_job, "hydra.sweeper.parallel=1")
    sweep = subprocess.Popen(args, env=cli_env(root), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    cells = root / "sweeps" / "warmkill" / "cells"
    victim = None
    deadline = time.monotonic() + 300
    while victim is None and time.monotonic() < deadline and sweep.poll() is None:
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


def _first_running(cells: Path, sweep: subprocess.Popen, seconds: float = 300) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and sweep.poll() is None:
        for path in sorted(cells.glob("*.json")) if cells.is_dir() else []:
            state = json.loads(path.read_text() or "{}")
            if state.get("status") == "running":
                return state
        time.sleep(0.2)
    raise AssertionError("no cell started")


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


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
    assert _gone(int(running["pid"]), 60), "the cell outlived its sweep"
    state = json.loads((cells / f"{running['cell']}.json").read_text())
    assert state["status"] == "killed"  # it saw SIGTERM and said so


def test_warm_and_cold_cells_log_the_same_scores(tmp_path, cli_env, hacrl_cmd, new_output_root,
                                                 tiny_job, sweep_file):
    scores = {}
    for warm in ("true", "false"):
        root = new_output_root(f"out-{warm}")
        args = _sweep_args(sweep_file, tmp_path, hacrl_cmd, "warmcold", "hacpo", root, tiny_job,
                           f"hydra.sweeper.warm={warm}")
        out = subprocess.run(args, env=cli_env(root), capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        assert ("(warm: forked" in out.stderr) == (warm == "true")
        assert "leaked semaphore" not in out.stderr  # cells exit through their finalizers
        scores[warm] = _scores(root)
    assert len(scores["true"]) == 2 and all(scores["true"].values())
    assert scores["true"] == scores["false"]
