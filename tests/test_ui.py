"""`hacrl ui`: takes output_root= like every command, serves the store's UI, and its MLflow server
(the whole process group) stops with it, on SIGTERM and when `hacrl ui` is killed outright."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def _start(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int, list[psutil.Process]]:
    from hacrl.tracking import Tracker

    Tracker(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}", "hacrl-tiny")  # a store to show
    port = _free_port()
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    ui = subprocess.Popen([sys.executable, "-m", "hacrl.cli", "ui",
                           f"output_root={tmp_path / 'out'}", "--port", str(port)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:  # until it answers (or ends); pytest-timeout ends a UI that never does
        while not _answers(port):
            assert ui.poll() is None, ui.stderr.read().decode() if ui.stderr else ""
            time.sleep(0.5)
    except BaseException:
        for child in psutil.Process(ui.pid).children(recursive=True):
            child.kill()
        ui.kill()
        raise
    server = psutil.Process(ui.pid).children(recursive=True)
    assert server  # mlflow ui and whatever it started
    return ui, port, server


def _wait_gone(processes: list[psutil.Process]) -> None:
    """Returns once the processes have ended: one that lives on times the test out."""
    psutil.wait_procs(processes)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
@pytest.mark.slow
def test_the_server_stops_with_hacrl_ui(tmp_path: Path, how: str) -> None:
    ui, port, server = _start(tmp_path)
    assert (tmp_path / "out" / "mlflow.db").exists()  # output_root= chose the store
    if how == "sigterm":
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(30) == 128 + signal.SIGTERM
    else:  # killed outright: the kernel's parent-death signal stops the server
        ui.kill()
        ui.wait(30)
    _wait_gone(server)
    assert not _answers(port)


def test_a_setting_other_than_output_root_is_one_line(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "hacrl.cli", "ui", "colour=red"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "output_root=PATH" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_views_show_each_sweeps_jobs_with_their_scores(tmp_path: Path) -> None:
    """`hacrl ui` writes, per sweep of an experiment's jobs, an MLflow shared view: its filter
    finds the sweep's jobs, its columns are method, pair, seed and each agent's AVG."""
    import json

    from mlflow.tracking import MlflowClient

    from hacrl.cli.ui import view_links
    from hacrl.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "hacrl-tiny")
    runs = {}
    for method, sweeps, model in (("hacpo", "table1,seeds", "a"), ("gspo", "table1", "b"),
                                  ("hacpo", "alpha", "a")):
        run = tracker.start_run(f"{method} · p · seed 0", {
            "hacrl.kind": "job", "hacrl.sweeps": sweeps, "method": method, "pair": "p",
            "seed": "0"})
        tracker.log_metrics(run, {f"avg/{model}": 0.5}, 1)
        runs[(method, sweeps)] = run
    tracker.start_run("hacpo · a", {"hacrl.kind": "agent", "hacrl.sweeps": "table1"})
    lines = view_links(uri, "http://127.0.0.1:5000")
    experiment = tracker.experiment_id
    assert f"  hacrl-tiny, the jobs of sweep table1: http://127.0.0.1:5000/#/experiments/" \
           f"{experiment}/runs?viewStateShareKey=hacrl-table1" in lines
    client = MlflowClient(uri)
    tags = client.get_experiment(experiment).tags
    assert {k for k in tags if k.startswith("mlflow.sharedViewState.")} == {
        f"mlflow.sharedViewState.hacrl-{v}" for v in ("jobs", "table1", "seeds", "alpha")}
    table1 = json.loads(tags["mlflow.sharedViewState.hacrl-table1"])
    found = client.search_runs([experiment], table1["searchFilter"])
    assert {r.info.run_id for r in found} == {runs[("hacpo", "table1,seeds")],
                                              runs[("gspo", "table1")]}
    assert table1["selectedColumns"][:5] == ["tags.`method`", "tags.`pair`", "tags.`seed`",
                                             "metrics.`avg/a`", "metrics.`avg/b`"]
    assert json.loads(tags["mlflow.sharedViewState.hacrl-alpha"])["selectedColumns"][3] == \
        "metrics.`avg/a`"
    # no store yet: nothing written, nothing said
    assert view_links(f"sqlite:///{tmp_path / 'none' / 'mlflow.db'}", "http://x") == []


def test_ui_faults_are_one_line_and_serve_nothing(tmp_path: Path) -> None:
    """No store at the output root (a typo), a URI MLflow has no store for, a port another
    process holds: each one `hacrl:` line, exit 1, nothing created and nothing served."""
    from hacrl.tracking import Tracker

    Tracker(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}", "hacrl-tiny")
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        cases = [([f"output_root={tmp_path / 'typo'}"], f"no MLflow store at {tmp_path / 'typo'}"),
                 (["--uri", "foo://x"], "MLflow has no store for scheme 'foo'"),
                 ([f"output_root={tmp_path / 'out'}", "--port", str(taken)],
                  f"ui: port {taken} on 127.0.0.1 is not free")]
        for args, needle in cases:
            out = subprocess.run([sys.executable, "-m", "hacrl.cli", "ui", *args], env=env,
                                 capture_output=True, text=True, timeout=60)
            lines = out.stderr.strip().splitlines()
            assert out.returncode == 1 and len(lines) == 1, out.stderr
            assert lines[0].startswith("hacrl: ") and needle in lines[0], lines
    assert not (tmp_path / "typo").exists()
