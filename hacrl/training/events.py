"""A team's training steps as events: the loop emits, listeners act.

`run_steps` drives `TeamLoop.step` from the step after the last checkpoint to the end and says
what happened and what is due; it knows nothing of MLflow, files or evaluation. The job
subscribes listeners (`hacrl.job.listeners`: metrics into MLflow, validation, checkpoints,
the progress bar), so a new consumer of training is a new listener, not an edit to the loop.

Order at every step t: `StepDone(t)`, then `ValidationDue(t)` when due, then
`CheckpointDue(t)` when due (the step's metrics are in before anything can fail after them).
`ValidationDue(0)` comes first on a fresh start, then `TrainingStarts` (the step it starts
after); `Finished` after the last step; `Failed`
when a step or a listener raised (the error is then raised on). When `stop()` turns true (a
SLURM job told to make way: `hacrl.job.requeue`), the steps end after the step in progress and
its events: a `CheckpointDue` there if none was due, then `Stopped`, and no `Finished`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from hacrl.training.loop import StepResult


@dataclass(frozen=True)
class TrainingStarts:
    step: int  # the last step already done: 0, or the checkpoint resumed from


@dataclass(frozen=True)
class StepDone:
    step: int
    result: StepResult


@dataclass(frozen=True)
class ValidationDue:
    step: int


@dataclass(frozen=True)
class CheckpointDue:
    step: int
    final: bool  # the last step of the run


@dataclass(frozen=True)
class Finished:
    steps: int


@dataclass(frozen=True)
class Stopped:
    step: int  # the last step done, checkpointed: the next run resumes after it


@dataclass(frozen=True)
class Failed:
    step: int  # the step being worked on
    error: BaseException


Event = TrainingStarts | StepDone | ValidationDue | CheckpointDue | Finished | Stopped | Failed


class Listener(Protocol):
    def __call__(self, event: Event) -> None: ...


@dataclass(frozen=True)
class Schedule:
    """When things are due: every `validate_every` steps (0: never) and at the end; a
    checkpoint every `save_every` steps and at the end."""

    steps: int
    validate_every: int
    save_every: int

    def validation_due(self, step: int) -> bool:
        return bool(self.validate_every) and (step % self.validate_every == 0 or step == self.steps)

    def checkpoint_due(self, step: int) -> bool:
        return step % self.save_every == 0 or step == self.steps


def run_steps(step_fn: Callable[[int], StepResult], start: int, schedule: Schedule,
              listeners: Sequence[Listener], stop: Callable[[], bool] | None = None) -> int:
    """Steps `start + 1 .. schedule.steps` of `step_fn` (a `TeamLoop.step`), with events;
    returns the last step done (`schedule.steps` unless `stop` ended them early)."""

    def emit(event: Event) -> None:
        for listener in listeners:
            listener(event)

    step = start
    try:
        if schedule.validate_every and start == 0:
            emit(ValidationDue(0))
        emit(TrainingStarts(start))
        for step in range(start + 1, schedule.steps + 1):
            emit(StepDone(step, step_fn(step)))
            if schedule.validation_due(step):
                emit(ValidationDue(step))
            due = schedule.checkpoint_due(step)
            if due:
                emit(CheckpointDue(step, final=step == schedule.steps))
            if stop is not None and step < schedule.steps and stop():
                if not due:
                    emit(CheckpointDue(step, final=False))
                emit(Stopped(step))
                return step
    except BaseException as err:
        emit(Failed(step, err))
        raise
    emit(Finished(schedule.steps))
    return schedule.steps
