"""A SLURM job told to make way (USR2: time limit near, or preemption): it stops at the end of
the step in progress with a checkpoint, its runs wait KILLED tagged `hacrl.requeued`, and the
requeued job carries on in the same runs with the curves of an uninterrupted one. Here in one
process, with submitit's handler stood in for; tests/test_cluster.py does it through sbatch."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from hacrl.config import compose, validate
from hacrl.job import lock, requeue, run_job
from hacrl.schema import tags as T
from hacrl.training.events import (
    CheckpointDue,
    Event,
    Finished,
    Schedule,
    StepDone,
    Stopped,
    run_steps,
)
from hacrl.training.loop import StepResult

AGENTS = ["qwen3-1.7b-base", "qwen3-4b-base"]
SCORING = ("task.train_split=tiny_gsm8k", "validation.benchmark=tiny_gsm8k")


def _names(events: list[Event]) -> list[str]:
    out = []
    for e in events:
        if isinstance(e, CheckpointDue):
            out.append(f"ckpt{e.step}{'!' if e.final else ''}")
        elif isinstance(e, Stopped):
            out.append(f"stop{e.step}")
        elif isinstance(e, Finished):
            out.append(f"end{e.steps}")
        elif isinstance(e, StepDone):
            out.append(f"step{e.step}")
    return out


@pytest.mark.parametrize(("stop_after", "save_every", "expected", "last"), [
    # a stop between checkpoints: one there, then Stopped, no Finished
    (2, 10, ["step1", "step2", "ckpt2", "stop2"], 2),
    # a stop where a checkpoint was due anyway: not saved twice
    (2, 2, ["step1", "step2", "ckpt2", "stop2"], 2),
    # a stop asked during the last step: the run ends as usual
    (4, 10, ["step1", "step2", "step3", "step4", "ckpt4!", "end4"], 4),
])
def test_a_stop_ends_the_steps_after_the_step_in_progress_with_a_checkpoint(
        stop_after: int, save_every: int, expected: list[str], last: int) -> None:
    seen: list[Event] = []
    done: list[int] = []

    def step(t: int) -> StepResult:
        done.append(t)
        return StepResult([{}])

    def listen(event: Event) -> None:
        seen.append(event)

    returned = run_steps(step, 0, Schedule(4, 0, save_every), [listen],
                         stop=lambda: bool(done) and done[-1] >= stop_after)
    assert _names(seen) == expected
    assert returned == last and done == list(range(1, last + 1))


@pytest.fixture
def slurm_job(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """This process as a SLURM submitit job: SUBMITIT_EXECUTOR=slurm and a USR2 handler standing
    in for submitit's (it records its calls); handlers and requeue state restored after."""
    calls: list[int] = []
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setattr(lock, "_terminate_requested", False)

    def submitit_handler(signum: int, frame: Any) -> None:
        calls.append(signum)

    signal.signal(signal.SIGUSR2, submitit_handler)
    assert requeue.install()
    assert requeue.install()  # twice: still the first handler to hand over to
    yield calls
    timer = requeue._state.sigterm_timer
    if timer is not None:
        timer.cancel()
        timer.join()
    requeue._state.reset()
    for s, handler in before.items():
        signal.signal(s, handler)


def test_outside_slurm_nothing_is_taken_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    before = signal.getsignal(signal.SIGUSR2)
    assert not requeue.install()
    assert signal.getsignal(signal.SIGUSR2) is before and not requeue.active()
    assert not requeue.defer_sigterm()  # a SIGTERM ends the job at once, as always


def test_usr2_outside_the_steps_stops_at_once_and_hands_over_to_submitit(
        slurm_job: list[int]) -> None:
    with pytest.raises(requeue.Requeued, match="requeued"):
        os.kill(os.getpid(), signal.SIGUSR2)
        threading.Event().wait(5)  # the handler raises at the next bytecode
    assert requeue.requested() and slurm_job == []  # not requeued before the job cleaned up
    requeue.hand_over()
    assert slurm_job == [signal.SIGUSR2]


def test_a_requeue_command_killed_by_its_own_requeue_counts_as_requeued(
        slurm_job: list[int]) -> None:
    """SLURM ends a requeued job's processes, `scontrol requeue` among them when it has not
    exited yet: submitit's handler then raises; the job is requeued all the same."""
    def killed_while_requeueing(signum: int, frame: Any) -> None:
        raise subprocess.CalledProcessError(-signal.SIGTERM, ["scontrol", "requeue", "46"])

    requeue._state.submitit_handler = killed_while_requeueing
    with pytest.raises(SystemExit):
        requeue.hand_over()

    def refused(signum: int, frame: Any) -> None:
        raise subprocess.CalledProcessError(1, ["scontrol", "requeue", "46"])

    requeue._state.submitit_handler = refused
    with pytest.raises(subprocess.CalledProcessError):  # a real failure stays one
        requeue.hand_over()


def test_usr2_inside_the_steps_only_marks_the_request(slurm_job: list[int]) -> None:
    with requeue.steps_stop_at_their_end():
        os.kill(os.getpid(), signal.SIGUSR2)
        for _ in range(1000):  # let the handler run
            if requeue.requested():
                break
            threading.Event().wait(0.001)
    assert requeue.requested() and slurm_job == []


def test_a_sigterm_under_slurm_waits_for_a_preemptions_usr2(
        slurm_job: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    signal.signal(signal.SIGTERM, lock.on_sigterm)
    with requeue.steps_stop_at_their_end():
        os.kill(os.getpid(), signal.SIGTERM)  # no exception: it waits for a USR2
        timer = requeue._state.sigterm_timer
        assert timer is not None and timer.is_alive()
        os.kill(os.getpid(), signal.SIGUSR2)  # the preemption's: the job stops to be requeued
        timer.join()  # cancelled: it ends without interrupting anything
        assert requeue.requested() and not lock._terminate_requested
        os.kill(os.getpid(), signal.SIGTERM)  # scontrol requeue's own SIGTERM changes nothing
    assert not lock._terminate_requested


def test_a_sigterm_with_no_usr2_after_it_ends_the_job_as_killed(
        slurm_job: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(requeue, "GRACE_S", 0.05)
    signal.signal(signal.SIGTERM, lock.on_sigterm)
    with pytest.raises(lock.Terminated):
        os.kill(os.getpid(), signal.SIGTERM)
        assert not lock._terminate_requested  # not yet: the grace runs
        threading.Event().wait(30)  # the timer interrupts this wait with the SIGTERM handler
    assert lock._terminate_requested and not requeue.requested()


def _client(root: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")


def _runs(client: MlflowClient, query: str) -> list:
    experiment = client.get_experiment_by_name("hacrl-tiny")
    assert experiment is not None
    return client.search_runs([experiment.experiment_id], query)


def _curves(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric history of a run except wall-clock and memory ones, points in logged order."""
    keys = client.get_run(run_id).data.metrics
    return {k: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, k),
                                                   key=lambda m: (m.step, m.timestamp))]
            for k in keys if not k.startswith(("time/", "memory/"))}


@pytest.mark.slow
def test_a_requeued_job_carries_on_in_the_same_runs_with_an_uninterrupted_runs_curves(
        job_env, new_output_root, tiny_job, slurm_job, assert_varies) -> None:
    steps, stop_at = 5, 2
    overrides = [*tiny_job, *SCORING, f"train.steps={steps}", "train.save_every=100"]
    root = new_output_root()
    spec = validate(compose([*overrides, f"output_root={root}"]))

    def usr2_at_step(progress: dict[str, Any]) -> None:  # SLURM's USR2 during step `stop_at`
        if progress.get("phase") == "training" and progress.get("step") == stop_at:
            os.kill(os.getpid(), signal.SIGUSR2)

    with pytest.raises(requeue.Requeued) as stopped:
        run_job(spec, progress=False, report=usr2_at_step)
    assert stopped.value.step == stop_at
    assert [p.name for p in (root / "runs").glob("*/team-0/ckpt/step_*")] == [f"step_{stop_at:06d}"]
    client = _client(root)
    (job,) = _runs(client, f"tags.`{T.KIND}` = 'job'")
    assert job.info.status == "KILLED" and job.data.tags[T.REQUEUED] == "1"
    agents = {r.data.tags["model"]: r.info.run_id
              for r in _runs(client, f"tags.`mlflow.parentRunId` = '{job.info.run_id}'")}
    assert sorted(agents) == AGENTS
    # nothing logged after the checkpoint: the requeued job can carry on in these runs
    for run_id in agents.values():
        assert max(s for c in _curves(client, run_id).values() for s, _ in c) == stop_at

    # the requeued job: a new process in real life, here the same one with fresh requeue state
    requeue._state.reset()
    signal.signal(signal.SIGUSR2, lambda signum, frame: slurm_job.append(signum))
    assert requeue.install()
    summary = run_job(validate(compose([*overrides, f"output_root={root}"])), progress=False)
    assert summary["job_run_id"] == job.info.run_id and summary["agent_run_ids"] == agents
    assert slurm_job == []  # run_job never hands over (hacrl.sweep.cell_run does)
    (again,) = _runs(client, f"tags.`{T.KIND}` = 'job'")
    assert again.info.status == "FINISHED"
    assert (again.data.tags[T.REQUEUED], again.data.tags[T.REQUEUES]) == ("0", "1")
    for run_id in agents.values():
        assert client.get_run(run_id).info.status == "FINISHED"

    straight_root = new_output_root("straight")
    straight = run_job(validate(compose([*overrides, f"output_root={straight_root}"])),
                       progress=False)
    for name, run_id in agents.items():
        curves = _curves(client, run_id)
        assert curves == _curves(_client(straight_root), straight["agent_run_ids"][name])
        # one point a step (none logged twice), and values that move after the stop
        assert [s for s, _ in curves["reward/mean"]] == list(range(1, steps + 1))
        assert_varies(f"{name} loss after the requeue",
                      [p for p in curves["loss/total"] if p[0] > stop_at])


@pytest.mark.slow
def test_force_after_a_requeue_starts_new_runs(job_env, new_output_root, tiny_job,
                                               slurm_job) -> None:
    """force=true retrains from step 0: the stopped runs are not reopened (their points
    would be logged twice)."""
    overrides = [*tiny_job, "train.steps=3", "train.save_every=100"]
    root = new_output_root()

    def usr2_at_step_1(progress: dict[str, Any]) -> None:
        if progress.get("phase") == "training" and progress.get("step") == 1:
            os.kill(os.getpid(), signal.SIGUSR2)

    with pytest.raises(requeue.Requeued):
        run_job(validate(compose([*overrides, f"output_root={root}"])), progress=False,
                report=usr2_at_step_1)
    (stopped,) = _runs(_client(root), f"tags.`{T.KIND}` = 'job'")
    requeue._state.reset()
    summary = run_job(validate(compose([*overrides, f"output_root={root}", "force=true"])),
                      progress=False)
    assert summary["job_run_id"] != stopped.info.run_id
    assert _client(root).get_run(stopped.info.run_id).info.status == "KILLED"
