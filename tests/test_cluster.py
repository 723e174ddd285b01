"""Sweeps through a real SLURM cluster (scripts/local_slurm.sh): sbatch job arrays through
submitit, a failed and a cancelled cell, preemption and time limits with requeue and resume into
the same MLflow runs, `hacrl status` while cells run, an impossible request refused at submit.

Marked `cluster`: they need a running cluster (`bash scripts/local_slurm.sh up` and its `env`)
and skip without one; CI starts one and sets HACRL_TEST_REQUIRE_CLUSTER=1, so there they fail instead.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from hacrl.config import compose, validate
from hacrl.job import run_job
from hacrl.schema import tags as T

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

AGENTS = ["qwen3-1.7b-base", "qwen3-4b-base"]
# a cell's training: scoring prompts (values that move), validation now and then
JOB = ("train.prompts_per_step=4", "train.minibatch_prompts=2", "train.rollouts_per_prompt=4",
       "rollout.max_new_tokens=16", "task.train_split=tiny_gsm8k", "validation.every=5",
       "validation.benchmark=tiny_gsm8k", "validation.problems=40",
       "eval.benchmarks=[tiny_gsm8k,tiny_aime2025]", "eval.protocols.main.limit=40")
SWEEP = """# @package _global_
defaults:
  - override /hydra/sweeper: hacrl
  - override /launcher: slurm_local
hydra:
  sweep:
    dir: ${{output_root}}/sweeps/{name}
    subdir: .jobs/${{hydra.job.num}}
  sweeper:
    name: {name}
    report:
      tables: [table2]
    grids:
{grids}"""


def _cluster_answers() -> str | None:
    """Why no cluster can be used (None: `scontrol ping` says the controller is UP)."""
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as err:
        return f"no SLURM client here ({err})"
    if ping.returncode != 0 or "UP" not in ping.stdout:
        return f"no SLURM controller answers: {(ping.stdout + ping.stderr).strip()[:200]}"
    return None


@pytest.fixture(scope="module")
def cluster() -> None:
    reason = _cluster_answers()
    if reason is None:
        return
    message = (f"{reason}; start one: bash scripts/local_slurm.sh up && "
               'eval "$(bash scripts/local_slurm.sh env)"')
    if os.environ.get("HACRL_TEST_REQUIRE_CLUSTER") == "1":
        pytest.fail(message)
    pytest.skip(message)


class Sweep:
    """One user sweep file in its own folder and output root, run with `hacrl sweep`."""

    def __init__(self, tmp_path: Path, name: str, grids: str, root: Path,
                 env: dict[str, str], hacrl_cmd: list[str], *extra: str) -> None:
        configs = tmp_path / f"configs-{name}" / "sweep"
        configs.mkdir(parents=True)
        (configs / f"{name}.yaml").write_text(SWEEP.format(name=name, grids=grids))
        self.name, self.root, self.cwd = name, root, tmp_path
        self.env = {**env, "HACRL_VENV": sys.prefix}  # the jobs' `setup` activates this venv
        self.args = [*hacrl_cmd, "sweep", name, f"hydra.searchpath=[file://{configs.parent}]",
                     f"output_root={root}", *JOB, *extra]
        self.dir = root / "sweeps" / name
        self.log = tmp_path / f"{name}.log"

    def start(self) -> subprocess.Popen[str]:
        with self.log.open("a") as log:
            return subprocess.Popen(self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    text=True, cwd=self.cwd)

    def run(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.args, env=self.env, capture_output=True, text=True,
                              timeout=900, cwd=self.cwd)

    def states(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted((self.dir / "cells").glob("*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except ValueError:  # being rewritten this instant
                continue
        return out

    def wait_for(self, process: subprocess.Popen[str], ready: Any) -> dict[str, Any]:
        """The first cell state for which `ready(state)` holds, polled until the sweep ends
        (no clock limit of its own: pytest-timeout ends a sweep that never gets there)."""
        while True:
            for state in self.states():
                if ready(state):
                    return state
            assert process.poll() is None, self.log.read_text()[-4000:]
            threading.Event().wait(0.2)

    def rows(self) -> list[dict[str, Any]]:
        return list(json.loads((self.dir / "status.json").read_text())["rows"])


def free_port() -> int:
    """A TCP port of 127.0.0.1 free at the time of asking."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _client(root: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{root / 'mlflow.db'}")


def _runs(root: Path, query: str) -> list:
    client = _client(root)
    return list(client.search_runs([e.experiment_id for e in client.search_experiments()], query))


def _curves(root: Path, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric history of a run but wall-clock and memory ones, in step order."""
    client = _client(root)
    return {k: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, k),
                                                   key=lambda m: (m.step, m.timestamp))]
            for k in client.get_run(run_id).data.metrics
            if not k.startswith(("time/", "memory/"))}


def _agent_runs(root: Path, job_run: str) -> dict[str, str]:
    return {r.data.tags["model"]: r.info.run_id
            for r in _runs(root, f"tags.`mlflow.parentRunId` = '{job_run}'")}


def _scancel(*args: str) -> None:
    done = subprocess.run(["scancel", *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_a_sweep_runs_through_sbatch_with_a_failed_and_a_cancelled_cell(
        cluster, tmp_path, new_output_root, cli_env, hacrl_cmd) -> None:
    grids = """      - pair: size
        method: hacpo
        train.steps: [2]
      - pair: size
        method: hacpo
        train.steps: [2]
        agents: ["[qwen3-1.7b-base,qwen3-8b-base]"]   # not in the micro zoo: its job fails
      - pair: size
        method: hacpo
        train.steps: [300]
        seed: [5]          # cancelled with scancel while it trains
"""
    root = new_output_root()
    sweep = Sweep(tmp_path, "cl", grids, root, cli_env(root), hacrl_cmd)
    process = sweep.start()
    try:
        long = sweep.wait_for(process, lambda s: s.get("steps") == 300 and s.get("step", 0) >= 1
                              and s.get("status") == "running")
        assert long.get("slurm_job"), long  # it runs under SLURM and says which job it is
        status = subprocess.run([*hacrl_cmd, "status", "cl", f"output_root={root}"],
                                env=sweep.env, capture_output=True, text=True, timeout=120)
        assert status.returncode == 0, status.stderr
        (line,) = [x for x in status.stdout.splitlines() if long["cell"] in x]
        assert line.startswith("running") and "training step" in line, status.stdout
        _scancel(str(long["slurm_job"]))
        process.wait(timeout=600)
    finally:
        process.kill()
    log = sweep.log.read_text()
    assert process.returncode != 0, log[-3000:]
    assert "as one job array" in log
    rows = {r["cell"]: r for r in sweep.rows()}
    assert Counter(r["status"] for r in rows.values()) == {"done": 1, "failed": 1,
                                                           "killed": 1}, log[-3000:]
    assert rows[long["cell"]]["status"] == "killed"
    (failed,) = [r for r in rows.values() if r["status"] == "failed"]
    assert "agents[1]=qwen3-8b-base: no model at" in failed["error"]
    jobs = _runs(root, "tags.`hacrl.kind` = 'job'")
    assert Counter(r.info.status for r in jobs) == {"FINISHED": 1, "KILLED": 1}
    assert not _runs(root, "attributes.status = 'RUNNING'")
    assert (root / "reports" / "cl-tiny" / "index.html").is_file(), log[-3000:]

    again = sweep.run()  # what is done is skipped; the others run again
    assert again.returncode != 0  # the failing cell fails again
    assert "1 done already" in again.stderr, again.stderr[-3000:]
    rows = {r["cell"]: r for r in sweep.rows()}
    assert rows[long["cell"]]["status"] == "done"
    assert Counter(r["status"] for r in rows.values()) == {"skipped": 1, "done": 1, "failed": 1}
    assert Counter(r.info.status for r in _runs(root, "tags.`hacrl.kind` = 'job'")) == {
        "FINISHED": 2, "KILLED": 1}


def test_an_impossible_request_is_one_line_at_submit(cluster, tmp_path, new_output_root,
                                                     cli_env, hacrl_cmd) -> None:
    grids = """      - pair: size
        method: hacpo
        train.steps: [2]
"""
    root = new_output_root()
    sweep = Sweep(tmp_path, "big", grids, root, cli_env(root), hacrl_cmd,
                  "hydra.launcher.cpus_per_task=64")
    done = sweep.run()
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("hacrl: sweep: hydra.launcher.cpus_per_task=64: more than SLURM can "
                           "give"), done.stderr[-2000:]
    assert "set hydra.launcher.cpus_per_task (or HACRL_SLURM_CPUS) to at most" in last
    assert "Traceback" not in done.stderr
    assert not list(sweep.dir.glob(".submitit/*")), "nothing was queued"


# The preemption and time-limit cells: long enough that a time limit of 1 minute strikes while
# they train (slurmctld signals USR2 when at most signal_delay_s + 30 s are left, checking every
# 30 s: with 20 s, between 10 s and 40 s into each attempt; a step takes 0.1-0.3 s here).
LONG = ("train.steps=400", "train.save_every=1000", "validation.every=100", "seed=3")
LONG_JOB = tuple(o for o in JOB if not o.startswith("validation.every=")) + LONG


def _check_requeued_like_straight(root: Path, straight: dict[str, Any], reason: str,
                                  assert_varies: Any) -> None:
    (job,) = _runs(root, "tags.`hacrl.kind` = 'job'")  # one job run, not one per attempt
    assert job.info.status == "FINISHED"
    assert int(job.data.tags[T.REQUEUES]) >= 1 and job.data.tags[T.REQUEUED] == "0"
    agents = _agent_runs(root, job.info.run_id)
    assert sorted(agents) == AGENTS
    steps = int(LONG[0].split("=")[1])
    for name, run_id in agents.items():
        curves = _curves(root, run_id)
        reference = _curves(Path(straight["root"]), straight["agent_run_ids"][name])
        assert curves.keys() == reference.keys()
        worst = max(abs(a[1] - b[1]) for k in curves for a, b in zip(curves[k], reference[k],
                                                                      strict=True))
        print(f"{reason}: {name}: {len(curves)} curves, max |difference| {worst:.3g}")
        assert curves == reference, name
        assert [s for s, _ in curves["reward/mean"]] == list(range(1, steps + 1))
        assert_varies(f"{name} loss", curves["loss/total"])


def test_preemption_and_a_time_limit_requeue_and_resume_into_the_same_runs(
        cluster, tmp_path, new_output_root, cli_env, hacrl_cmd, job_env, assert_varies) -> None:
    grids = """      - pair: size
        method: hacpo
"""
    preempted_root, limited_root = new_output_root("preempted"), new_output_root("limited")
    preempted = Sweep(tmp_path, "pre", grids, preempted_root, cli_env(preempted_root), hacrl_cmd)
    preempted.args = [a for a in preempted.args if a not in JOB] + list(LONG_JOB)
    limited = Sweep(tmp_path, "lim", grids, limited_root, cli_env(limited_root), hacrl_cmd,
                    "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=20")
    limited.args = [a for a in limited.args if a not in JOB] + list(LONG_JOB)
    first, second = preempted.start(), limited.start()
    try:
        # preemption as SLURM signals it (USR2 to the job's tasks), mid-training
        cell = preempted.wait_for(first, lambda s: s.get("step", 0) >= 3
                                  and s.get("status") == "running" and s.get("slurm_job"))
        _scancel("--signal=USR2", str(cell["slurm_job"]))
        requeued = preempted.wait_for(first, lambda s: s.get("status") == "requeued")
        # held in the queue (SLURM delays a requeued job's start by some seconds): `hacrl
        # status` shows it waiting, then it goes on
        hold = subprocess.run(["scontrol", "hold", str(cell["slurm_job"])], capture_output=True,
                              text=True, timeout=30)
        status = subprocess.run([*hacrl_cmd, "status", "pre", f"output_root={preempted_root}"],
                                env=preempted.env, capture_output=True, text=True, timeout=120)
        if hold.returncode == 0:
            assert f"requeued after step {requeued['step']}" in status.stdout, status.stdout
            assert status.stdout.splitlines()[1].startswith("running")
            subprocess.run(["scontrol", "release", str(cell["slurm_job"])], check=True,
                           timeout=30)
        else:  # it started again before the hold: it runs
            assert "running" in status.stdout, (hold.stderr, status.stdout)
        # the uninterrupted run, in this process while the cluster works
        straight_root = new_output_root("straight")
        straight = run_job(validate(compose(["pair=size", "method=hacpo", *LONG_JOB,
                                             f"output_root={straight_root}"])), progress=False)
        straight["root"] = str(straight_root)
        first.wait(timeout=600)
        second.wait(timeout=600)
    finally:
        first.kill()
        second.kill()
    for sweep, process, reason in ((preempted, first, "preemption"),
                                   (limited, second, "time limit")):
        text = sweep.log.read_text()
        assert process.returncode == 0, text[-3000:]
        (row,) = sweep.rows()
        assert row["status"] == "done", text[-3000:]
        cell_log = Path(row["log"]).read_text()
        assert f"requeued by SLURM ({reason})" in cell_log, cell_log[-3000:]
        assert "resumed at step" in cell_log
        _check_requeued_like_straight(sweep.root, straight, reason, assert_varies)


# a two-agent HACPO job through verl on CPU, one worker per agent per node: with two nodes each
# agent's pool has a worker on each node
VERL_JOB = ("engine=verl", "engine.device=cpu", "engine.nnodes=2", "engine.cpu_workers=1",
            "train.steps=2", "train.save_every=1", "train.prompts_per_step=4",
            "train.minibatch_prompts=2", "train.rollouts_per_prompt=4",
            "rollout.max_new_tokens=12", "task.train_split=tiny_gsm8k", "validation.every=1",
            "validation.benchmark=tiny_gsm8k", "validation.problems=40",
            "eval.benchmarks=[tiny_gsm8k]", "eval.protocols.main.limit=40")


def _ray_processes(temp_dir: str) -> list[str]:
    """Processes of the Ray whose session lives under `temp_dir` (their command lines name it)."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if temp_dir in line and "pytest" not in line:
            found.append(f"{process.pid}: {line[:160]}")
    return found


def _no_ray_left(temp_dir: str, within_s: float = 120.0) -> list[str]:
    """The Ray processes of `temp_dir` still alive after waiting up to `within_s` for them to
    go: a stopped `ray start` drains its node for up to 30 s after the job's result is in."""
    import time

    deadline = time.monotonic() + within_s
    while (left := _ray_processes(temp_dir)) and time.monotonic() < deadline:
        time.sleep(2)
    return left


def _task_logs(sweep: Sweep) -> dict[str, str]:
    """Each submitit task's log (stdout and stderr) by file name."""
    return {path.name: path.read_text(errors="replace")
            for path in sorted(sweep.dir.glob(".submitit/*/*_log.*"))}


@pytest.mark.verl
def test_a_two_node_verl_job_makes_one_ray_cluster_of_its_nodes(
        cluster, tmp_path, new_output_root, cli_env, hacrl_cmd) -> None:
    """engine=verl engine.nnodes=2 as one SLURM job of two nodes: node 0 starts the Ray head,
    node 1 joins it as a worker node, each agent's workers are placed on both, two HACPO steps
    train and checkpoint, and no Ray process is left when the job ends."""
    pytest.importorskip("verl", reason="the two-node verl job needs the [verl] extra")
    import tempfile

    grids = """      - pair: size
        method: hacpo
"""
    root = new_output_root()
    temp_dir = tempfile.mkdtemp(prefix="hacrl-ray-", dir="/tmp")  # Ray's sockets: a short path
    port = free_port()
    sweep = Sweep(tmp_path, "two", grids, root, cli_env(root), hacrl_cmd)
    sweep.args = [a for a in sweep.args if a not in JOB] + [
        *VERL_JOB, f"engine.ray.port={port}", f"engine.ray.temp_dir={temp_dir}"]
    done = sweep.run()
    logs = _task_logs(sweep)
    everything = "\n".join(f"--- {name}\n{text[-3000:]}" for name, text in logs.items())
    assert done.returncode == 0, done.stderr[-3000:] + everything
    (row,) = sweep.rows()
    assert row["status"] == "done", everything
    head = "".join(text for name, text in logs.items() if "_0_log" in name)
    worker = "".join(text for name, text in logs.items() if "_1_log" in name)
    assert "Ray runtime started" in head and "Ray runtime started" in worker, everything
    assert re.search(rf"joins the Ray head at \S+:{port} as a worker node", worker), worker
    for agent in AGENTS:
        (line,) = [x for x in head.splitlines() if x.startswith(f"hacrl: {agent}: verl workers")]
        print(line)
        assert line.endswith("(2 node(s))"), line
    steps = sorted(p.parent.name for p in root.glob("runs/*/team-0/ckpt/step_*/COMPLETE"))
    assert steps == ["step_000001", "step_000002"], steps
    (job,) = _runs(root, "tags.`hacrl.kind` = 'job'")
    assert job.info.status == "FINISHED"
    assert sorted(_agent_runs(root, job.info.run_id)) == AGENTS
    assert not (left := _no_ray_left(temp_dir)), left


@pytest.mark.verl
def test_a_worker_node_that_dies_ends_the_two_node_job_with_one_error(
        cluster, tmp_path, new_output_root, cli_env, hacrl_cmd) -> None:
    """The worker node's Ray processes die mid-training (SIGKILL, as a node that goes down):
    the job ends failed with one line naming the agent and what to do, and no Ray process of
    either node is left."""
    pytest.importorskip("verl", reason="the two-node verl job needs the [verl] extra")
    import signal
    import tempfile

    import psutil

    grids = """      - pair: size
        method: hacpo
"""
    root = new_output_root()
    temp_dir = tempfile.mkdtemp(prefix="hacrl-ray-", dir="/tmp")
    port = free_port()
    sweep = Sweep(tmp_path, "lost", grids, root, cli_env(root), hacrl_cmd)
    sweep.args = [a for a in sweep.args if a not in JOB] + [
        *(o for o in VERL_JOB if not o.startswith("train.steps")), "train.steps=200",
        f"engine.ray.port={port}", f"engine.ray.temp_dir={temp_dir}"]
    process = sweep.start()
    try:
        sweep.wait_for(process, lambda s: s.get("status") == "running" and s.get("step", 0) >= 1)
        (node,) = [p for p in psutil.process_iter(["cmdline"])
                   if any(a.startswith("--address=") and a.endswith(f":{port}")
                          for a in p.info["cmdline"] or [])
                   and "start" in (p.info["cmdline"] or [])]
        os.killpg(node.pid, signal.SIGKILL)  # the worker node's raylet and workers with it
        process.wait(timeout=600)
    finally:
        process.kill()
    (row,) = sweep.rows()
    assert row["status"] == "failed", sweep.log.read_text()[-3000:]
    assert row["error"].startswith("EngineError: "), row["error"]
    assert "a verl worker died during" in row["error"] and "rerun the same command" in row["error"]
    (job,) = _runs(root, "tags.`hacrl.kind` = 'job'")
    assert job.info.status == "FAILED"
    assert not (left := _no_ray_left(temp_dir)), left
