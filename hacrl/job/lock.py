"""One trainer per job, one evaluation-only job per model at a time, and a process that ends as
KILLED when a scheduler stops it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from hacrl.core.errors import HacrlError
from hacrl.core.layout import RunDir
from hacrl.job import requeue


@contextlib.contextmanager
def job_lock(directory: Path, config_hash: str) -> Iterator[None]:
    """An exclusive lock on the job for the life of this process's work on it (flock: released
    when the process ends, however it ends; on NFS when the lost client's lease expires), so
    two processes never train into one run directory, whatever a sweep's state files say."""
    path = RunDir(directory).lock
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise HacrlError(f"job {config_hash} is being trained by {holder} (it holds "
                             f"{path}); wait for it to end or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def evaluation_lock(output_root: Path, model: str, label: str) -> Iterator[None]:
    """Evaluation-only jobs of one model (`method=base`, `hacrl eval`) one at a time, as the
    job lock keeps trainers apart: the second waits (it says so once), then finds the first's
    run and its scores logged, instead of creating a second run or logging every metric twice.
    `model`: the model's path (or run id); `label` names it in the waiting line."""
    import sys

    from hacrl.core.layout import Layout

    path = Layout(output_root).evaluation_lock(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            print(f"hacrl: waiting for the evaluation of {label} that {holder} runs (it holds "
                  f"{path})", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        os.close(fd)


class Terminated(BaseException):
    """SIGTERM (e.g. a scheduler's kill) becomes an exception so runs end as KILLED."""


_terminate_requested = False  # a SIGTERM came (its exception may have been swallowed)


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    # the first SIGTERM ends the job through `Terminated`; a repeat while it finishes (a
    # scheduler's second notice, a parent's death signal) must not cut the cleanup short: runs
    # and state would stay RUNNING. SIGKILL still ends a cleanup that hangs.
    global _terminate_requested
    if requeue.defer_sigterm():  # under SLURM: perhaps a preemption, whose USR2 follows
        return
    _terminate_requested = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


def raise_if_terminated() -> None:
    """`Terminated` if a SIGTERM came whose exception never reached the job: a handler that runs
    inside a weakref callback or `__del__` (e.g. SQLAlchemy's state cleanup) raises where Python
    prints "Exception ignored" and goes on, and the signal itself is ignored from then on."""
    if _terminate_requested:
        raise Terminated()


def process_age_s() -> float:
    """Seconds since this process started (interpreter start, imports, compose, launch).

    On Linux from the process's start in clock ticks since boot against the boot-time clock:
    psutil's create_time adds the boot time, which the kernel gives in whole seconds, and
    read ~0.45 s too old on this machine."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
