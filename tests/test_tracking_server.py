"""Jobs logging to an `mlflow server` started as docs/CLUSTER.md tells cluster users to (sqlite
backend, artifacts served by the server, bound to 127.0.0.1): a sweep's parallel cells get
every metric point in; a server killed mid-sweep and restarted loses and duplicates nothing
(the cells' writes wait through MLflow's retries, or the cells fail alone and a rerun completes
them); a server gone for good ends a job with one line, and the rerun resumes it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow

# cells that score (values that move), validate now and then, and evaluate briefly
JOB = ("train.steps=24", "train.prompts_per_step=4", "train.minibatch_prompts=2",
       "train.rollouts_per_prompt=4", "rollout.max_new_tokens=16",
       "task.train_split=tiny_gsm8k", "validation.every=8", "validation.benchmark=tiny_gsm8k",
       "validation.problems=40", "eval.benchmarks=[tiny_gsm8k]", "eval.protocols.main.limit=40")


class Server:
    """`mlflow server` in a process group of its own, on a free port of 127.0.0.1; `kill()`
    ends the whole group at once (SIGKILL: no goodbye to the clients), `start()` again serves
    the same store on the same port."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        mlflow = Path(sys.executable).with_name("mlflow")
        self.starts += 1
        with (self.folder / f"server-{self.starts}.log").open("wb") as log:
            self.process = subprocess.Popen(
                [str(mlflow), "server", "--backend-store-uri",
                 f"sqlite:///{self.folder / 'mlflow.db'}", "--artifacts-destination",
                 str(self.folder / "mlartifacts"), "--host", "127.0.0.1", "--port",
                 str(self.port), "--workers", "2"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        while not self.answers():  # pytest-timeout ends a server that never comes
            assert self.process.poll() is None, self.log()
            threading.Event().wait(0.5)

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def log(self) -> str:
        return (self.folder / f"server-{self.starts}.log").read_text(errors="replace")[-3000:]

    def client(self) -> MlflowClient:
        return MlflowClient(self.uri)


@pytest.fixture
def server(tmp_path: Path) -> Any:
    started = Server(tmp_path / "server")
    started.start()
    yield started
    if started.process is not None and started.process.poll() is None:
        started.kill()


def _runs(client: MlflowClient, experiment: str, query: str = "") -> list:
    found = client.get_experiment_by_name(experiment)
    return list(client.search_runs([found.experiment_id], query)) if found else []


def _points(client: MlflowClient, experiment: str) -> dict[tuple[str, ...], Counter]:
    """Per finished agent run (by method and model): how many points each metric has at
    each step, wall-clock and memory metrics included (they are points too)."""
    out: dict[tuple[str, ...], Counter] = {}
    for run in _runs(client, experiment, "attributes.status = 'FINISHED' and "
                     "tags.`hacrl.kind` = 'agent'"):
        key = (run.data.tags["method"], run.data.tags["model"])
        assert key not in out, f"two finished agent runs of {key}"
        out[key] = Counter((name, point.step) for name in run.data.metrics
                           for point in client.get_metric_history(run.info.run_id, name))
    return out


def _values(client: MlflowClient, experiment: str) -> dict[tuple[str, ...], dict]:
    """Per finished agent run: every curve but wall-clock and memory ones, in step order."""
    out: dict[tuple[str, ...], dict] = {}
    for run in _runs(client, experiment, "attributes.status = 'FINISHED' and "
                     "tags.`hacrl.kind` = 'agent'"):
        out[(run.data.tags["method"], run.data.tags["model"])] = {
            name: sorted((p.step, p.value) for p in client.get_metric_history(run.info.run_id,
                                                                               name))
            for name in run.data.metrics if not name.startswith(("time/", "memory/"))}
    return out


def _sweep(name: str, root: Path, experiment: str, configs: Path,
           hacrl_cmd: list[str]) -> list[str]:
    return [*hacrl_cmd, "sweep", name, f"hydra.searchpath=[file://{configs.parent}]",
            f"output_root={root}", f"tracking.experiment={experiment}",
            "hydra.sweeper.parallel=3", *JOB]


def _cell_states(root: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted((root / "sweeps" / name / "cells").glob("*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except ValueError:  # being rewritten this instant
            continue
    return out


def test_a_parallel_sweep_against_a_server_that_is_killed_and_restarted(
        server, tmp_path, sweep_file, cli_env, hacrl_cmd, assert_varies) -> None:
    configs = tmp_path / "configs" / "sweep"
    sweep_file(configs, "srv", "[gspo, hacpo, naive]")   # 4 cells: gspo is one per agent
    env = {**cli_env(tmp_path / "out"), "MLFLOW_TRACKING_URI": server.uri,
           # the cells' writes wait through a restart of the server (~15-30 s here): MLflow's
           # retries sleep 0, 2, 4, 8, 16, 32 s (hacrl's default bound, ~15 s, is shorter)
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "6"}
    client = server.client()

    # undisturbed: every point of every cell arrives, once
    root = tmp_path / "out"
    args = _sweep("srv", root, "calm", configs, hacrl_cmd)
    calm = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert calm.returncode == 0, calm.stderr[-3000:]
    reference = _points(client, "calm")
    assert len(reference) == 6  # hacpo 2 agents + naive 2 + gspo 1 + 1
    steps = int(JOB[0].split("=")[1])
    for key, points in reference.items():
        assert set(points.values()) == {1}, f"{key}: a point twice"
        assert {s for (name, s) in points if name == "reward/mean"} == set(range(1, steps + 1))
        assert {s for (name, s) in points if name.startswith("val/")} == {0, 8, 16, 24}, key
        assert any(name.startswith("eval/") for name, _ in points), key
    total = sum(sum(p.values()) for p in reference.values())

    # the same sweep in another experiment; the server dies while its cells train
    log = tmp_path / "killed.log"
    root = tmp_path / "out2"
    args = _sweep("srv", root, "killed", configs, hacrl_cmd)
    with log.open("w") as out:
        process = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        while sum(s.get("status") == "running" and s.get("step", 0) >= 3
                  for s in _cell_states(root, "srv")) < 1:
            assert process.poll() is None, log.read_text()[-3000:]
            threading.Event().wait(0.2)
        before = sum(sum(p.values()) for p in _all_points(client, "killed").values())
        server.kill()
        threading.Event().wait(3.0)  # down a while: writes in flight fail and are retried
        server.start()
        process.wait(timeout=900)
    finally:
        process.kill()
    text = log.read_text()
    states = {s["cell"]: s for s in _cell_states(root, "srv")}
    failed = {c: s for c, s in states.items() if s["status"] != "done"}
    for state in failed.values():  # a cell that gave up says why in one line
        assert state["status"] == "failed", state
        assert state["error"].startswith(f"StoreError: MLflow tracking server {server.uri} "
                                         "stopped answering"), state["error"]
    if failed:
        again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
        assert again.returncode == 0, again.stderr[-3000:]
    else:
        assert process.returncode == 0, text[-3000:]
    after = _points(client, "killed")
    print(f"mlflow server killed and restarted mid-sweep: {before} points in before the kill; "
          f"{sum(sum(p.values()) for p in after.values())} after, {total} in the undisturbed "
          f"sweep; cells that failed and were rerun: {len(failed)}")
    # nothing lost, nothing twice: the same points per run, metric and step, and the same
    # curves, as the undisturbed sweep's
    assert after == reference
    values, calm_values = _values(client, "killed"), _values(client, "calm")
    assert values == calm_values
    for key, curves in values.items():
        assert_varies(f"{key} loss", curves["loss/total"])
    jobs = _runs(client, "killed", "tags.`hacrl.kind` = 'job'")
    assert Counter(r.info.status for r in jobs)["FINISHED"] == 4
    assert not _runs(client, "killed", "attributes.status = 'RUNNING'")


def _all_points(client: MlflowClient, experiment: str) -> dict[str, Counter]:
    """Points per agent run of any status (a run still training included)."""
    return {run.info.run_id: Counter(
        (name, p.step) for name in run.data.metrics
        for p in client.get_metric_history(run.info.run_id, name))
        for run in _runs(client, experiment, "tags.`hacrl.kind` = 'agent'")}


def test_a_server_gone_for_good_ends_a_job_with_one_line_and_the_rerun_resumes(
        server, tmp_path, cli_env, hacrl_cmd, assert_varies) -> None:
    root = tmp_path / "out"
    env = {**cli_env(root), "MLFLOW_TRACKING_URI": server.uri,
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}   # give up after one retry
    steps = 40
    args = [*hacrl_cmd, "train", "pair=size", "method=hacpo", f"output_root={root}",
            *[o for o in JOB if not o.startswith("train.steps")], f"train.steps={steps}",
            "train.save_every=3"]
    process = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    client = server.client()
    try:
        # killed once the job has a checkpoint to resume from
        while not list(root.glob("runs/*/team-0/ckpt/step_*/COMPLETE")):
            assert process.poll() is None, process.communicate()[1][-3000:]
            threading.Event().wait(0.5)
        server.kill()
        _, stderr = process.communicate(timeout=600)
    finally:
        process.kill()
    assert process.returncode != 0
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [x for x in stderr.strip().splitlines() if x.startswith("hacrl:")]
    assert lines and lines[-1].startswith(
        f"hacrl: MLflow tracking server {server.uri} stopped answering"), stderr[-3000:]
    assert "rerun the same command" in lines[-1]

    server.start()
    resumed = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (job,) = _runs(client, "hacrl-tiny", "attributes.status = 'FINISHED' and "
                   "tags.`hacrl.kind` = 'job'")
    assert Counter(r.info.status for r in _runs(client, "hacrl-tiny", "tags.`hacrl.kind` = "
                                                "'job'")) == {"FINISHED": 1, "KILLED": 1}
    for run in _runs(client, "hacrl-tiny", f"tags.`mlflow.parentRunId` = '{job.info.run_id}'"):
        assert int(run.data.tags["hacrl.resumed_at_step"]) >= 3  # from the checkpoint
        # the stopped run's curves up to its checkpoint, then the rerun's: each step once
        reward = client.get_metric_history(run.info.run_id, "reward/mean")
        assert sorted(p.step for p in reward) == list(range(1, steps + 1))
        assert_varies("reward", [(p.step, p.value) for p in reward])
