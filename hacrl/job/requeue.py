"""A SLURM job told to make way: its time limit is near, or it is preempted.

SLURM sends USR2 `signal_delay_s` before a job's time limit (submitit's `--signal`), and on
preemption where the cluster says so (`PreemptParameters=send_user_signal`), after a SIGTERM.
submitit's own answer is to requeue the job and exit at once: every step since the last
periodic checkpoint is lost and the requeued job starts new MLflow runs.

A sweep cell answers instead (`install`, from `hacrl.sweep.cell_run`): USR2 asks the training
to stop at the end of the step in progress (`requested`, polled by `hacrl.training.events.run_steps`),
which saves a checkpoint there; the job's runs end KILLED tagged `hacrl.requeued`; then
submitit's handler requeues the job and exits (`hand_over`). The requeued job resumes from that
checkpoint into the same runs (`hacrl.job.runs.reopen_requeued`), so its curves are those of an
uninterrupted run. Outside the training steps (loading, evaluation) USR2 stops the job at once:
it resumes from its newest checkpoint all the same.

A SIGTERM under SLURM is a cancel (`scancel`) or the first notice of a preemption; it waits
GRACE_S for the preemption's USR2 (`defer_sigterm`), then ends the job as KILLED as everywhere.
"""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

GRACE_S = 2.0  # a SIGTERM waits this long for a preemption's USR2 (KillWait is 30 s by default)


class Requeued(BaseException):
    """The job stopped to be requeued by SLURM; its runs are reopened when it comes back."""

    def __init__(self, step: int | None = None) -> None:
        where = f" after step {step}" if step is not None else ""
        super().__init__(f"stopped{where} to be requeued (SLURM time limit or preemption)")
        self.step = step


class _State:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.submitit_handler: Callable[..., Any] | None = None  # set: a SLURM submitit job
        self.requested = False       # a USR2 came
        self.in_steps = False        # the training steps run: they stop at the step's end
        self.sigterm_timer: threading.Timer | None = None
        self.sigterm_final = False   # the grace is over: the next SIGTERM handler call kills


_state = _State()


def under_slurm() -> bool:
    return os.environ.get("SUBMITIT_EXECUTOR") == "slurm"


def install() -> bool:
    """Take over USR2 from submitit in a SLURM job (main thread); False elsewhere."""
    if not under_slurm():
        return False
    current = signal.getsignal(signal.SIGUSR2)
    if current is _on_usr2:
        return True
    if not callable(current):  # not submitit's handler: nothing to hand over to
        return False
    _state.reset()
    _state.submitit_handler = current
    signal.signal(signal.SIGUSR2, _on_usr2)
    return True


def active() -> bool:
    return _state.submitit_handler is not None


def requested() -> bool:
    """A USR2 came: the training stops at the end of the step in progress."""
    return _state.requested


def _on_usr2(signum: int, frame: FrameType | None) -> None:
    _state.requested = True
    if _state.sigterm_timer is not None:  # the SIGTERM before it was a preemption's
        _state.sigterm_timer.cancel()
    if not _state.in_steps:
        raise Requeued()


class steps_stop_at_their_end:
    """While the training steps run, USR2 only marks the request: `run_steps` polls
    `requested` after each step and stops there with a checkpoint."""

    def __enter__(self) -> None:
        _state.in_steps = True

    def __exit__(self, *exc: object) -> None:
        _state.in_steps = False


def defer_sigterm() -> bool:
    """For the job's SIGTERM handler: True when it should not end the job now. Under SLURM the
    first SIGTERM waits GRACE_S for a preemption's USR2; if none came, the handler is called
    again in the main thread and ends the job. After a USR2 a SIGTERM changes nothing."""
    if not active() or _state.sigterm_final:
        return False
    if _state.requested:
        return True
    if _state.sigterm_timer is None:
        def grace_over() -> None:
            if not _state.requested:
                _state.sigterm_final = True
                _thread.interrupt_main(signal.SIGTERM)

        _state.sigterm_timer = threading.Timer(GRACE_S, grace_over)
        _state.sigterm_timer.daemon = True
        _state.sigterm_timer.start()
    return True


def reason() -> str:
    """"time limit" or "preemption", as submitit tells them apart (the job's end time)."""
    owner = getattr(_state.submitit_handler, "__self__", None)
    try:
        return "time limit" if owner is not None and owner.has_timed_out() else "preemption"
    except Exception:  # submitit could not ask SLURM: say what is sure
        return "time limit or preemption"


def hand_over() -> None:
    """Let submitit requeue the job: it pickles the job again, calls `scontrol requeue` and
    exits (SystemExit), or raises when the job ran out of requeues."""
    handler = _state.submitit_handler
    if handler is None:
        raise RuntimeError("hand_over outside a SLURM submitit job")
    try:
        handler(signal.SIGUSR2, None)
    except subprocess.CalledProcessError as err:
        if err.returncode != -signal.SIGTERM:
            raise
        # `scontrol requeue` ended by the requeue it asked for: SLURM stops the job's processes,
        # this child among them, sometimes before it exits. The job is requeued: exit as
        # submitit does (an error here would end the sweep's wait for a job that goes on)
        sys.exit(-1)
