"""The step driver's events: what is emitted, in which order, and on failure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from hacrl.training.events import (
    CheckpointDue,
    Event,
    Failed,
    Finished,
    Listener,
    Schedule,
    StepDone,
    TrainingStarts,
    run_steps,
)
from hacrl.training.loop import StepResult


def _into(seen: list[Event]) -> Listener:
    """A listener that appends each event to `seen`."""
    def listen(event: Event) -> None:
        seen.append(event)
    return listen


def _names(events: list[Event]) -> list[str]:
    out = []
    for e in events:
        if isinstance(e, CheckpointDue):
            out.append(f"ckpt{e.step}{'!' if e.final else ''}")
        elif isinstance(e, Failed):
            out.append(f"failed{e.step}")
        elif isinstance(e, Finished):
            out.append(f"end{e.steps}")
        elif isinstance(e, TrainingStarts):
            out.append(f"from{e.step}")
        else:
            out.append(f"{'step' if isinstance(e, StepDone) else 'val'}{e.step}")
    return out


def test_a_fresh_run_validates_first_and_everything_is_due_at_the_end() -> None:
    seen: list[Event] = []
    run_steps(lambda t: StepResult([{"t": t}]), 0, Schedule(5, validate_every=2, save_every=3),
              [_into(seen)])
    assert _names(seen) == ["val0", "from0", "step1", "step2", "val2", "step3", "ckpt3", "step4", "val4",
                            "step5", "val5", "ckpt5!", "end5"]
    assert [e.result.agent_metrics[0]["t"] for e in seen if isinstance(e, StepDone)] == [1, 2, 3, 4, 5]


def test_a_resumed_run_starts_after_its_checkpoint_without_validating_first() -> None:
    seen: list[Event] = []
    run_steps(lambda t: StepResult([{}]), 3, Schedule(4, validate_every=0, save_every=10),
              [_into(seen)])
    assert _names(seen) == ["from3", "step4", "ckpt4!", "end4"]


def test_a_failing_step_or_listener_is_announced_then_raised() -> None:
    seen: list[Event] = []

    def step(t: int) -> StepResult:
        if t == 2:
            raise RuntimeError("boom")
        return StepResult([{}])

    with pytest.raises(RuntimeError, match="boom"):
        run_steps(step, 0, Schedule(3, 0, 1), [_into(seen)])
    assert _names(seen) == ["from0", "step1", "ckpt1", "failed2"]

    def refuse_checkpoints(event: Event) -> None:
        if isinstance(event, CheckpointDue):
            raise OSError("disk full")

    seen.clear()
    with pytest.raises(OSError):
        run_steps(lambda t: StepResult([{}]), 0, Schedule(2, 0, 1), [_into(seen), refuse_checkpoints])
    assert _names(seen) == ["from0", "step1", "ckpt1", "failed1"]
    assert isinstance(seen[-1], Failed) and isinstance(seen[-1].error, OSError)


def test_step_metrics_are_written_in_batches_and_complete_at_every_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer MLflow writes than steps, yet every step's metrics with its own time; all steps up
    to a checkpoint are in the store when the checkpoint is saved, and those before a failure
    when it is raised."""
    from mlflow.tracking import MlflowClient

    from hacrl.job.listeners import StepMetrics
    from hacrl.tracking import Tracker

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "hacrl")
    runs = {a: tracker.start_run(a, {}) for a in ("a", "b")}
    writes: list[str] = []
    log_steps = tracker.log_steps

    def counted(run_id: str, steps: Sequence[tuple[int, Mapping[str, float], int]]) -> None:
        writes.append(run_id)
        log_steps(run_id, steps)

    monkeypatch.setattr(tracker, "log_steps", counted)
    client = MlflowClient(tracker.uri)

    def logged(agent: str) -> list[int]:
        return [m.step for m in client.get_metric_history(runs[agent], "loss")]

    at_checkpoint: list[list[int]] = []

    def checkpoint(event: Event) -> None:  # registered after the metrics, as in a job
        if isinstance(event, CheckpointDue):
            at_checkpoint.append(logged("b"))

    def step(k: int) -> StepResult:
        if k == 8:
            raise RuntimeError("boom")
        return StepResult([{"loss": float(k)}, {"loss": -float(k)}], {"team": 1.0})

    metrics = StepMetrics(tracker, runs, ["a", "b"], flush_s=3600.0)
    with pytest.raises(RuntimeError):
        run_steps(step, 0, Schedule(10, 0, 4), [metrics, checkpoint])
    assert at_checkpoint == [[1, 2, 3, 4]]
    assert logged("a") == logged("b") == list(range(1, 8))  # written when step 8 failed
    assert len(writes) == 2 * 2  # per agent: at the checkpoint and at the failure
    history = client.get_metric_history(runs["a"], "loss")
    assert [m.value for m in history] == [float(k) for k in range(1, 8)]
    assert [m.timestamp for m in history] == sorted(m.timestamp for m in history)
    assert client.get_run(runs["a"]).data.metrics["team"] == 1.0
