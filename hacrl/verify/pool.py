"""A small process pool with a hard deadline per item.

Why not `multiprocessing.Pool` or `concurrent.futures`: neither can stop one runaway task. Here
every worker has its own Pipe; the parent hands an item to an idle worker, waits on all pipes and
process sentinels with `multiprocessing.connection.wait`, and a worker whose item outlives its
deadline (measured from dispatch) is SIGKILLed and replaced while the others keep working. An
item that overruns, or whose worker dies, scores 0; nothing a worker does can stall a batch for
longer than about ceil(runaways / workers) * timeout.

Workers are fresh interpreters (`python -c ...` over a socketpair), started lazily, reused
across calls and shut down by `close()` or at interpreter exit. Not `fork`: the parent may hold
torch threads, which a forked child would inherit in an undefined state. Not multiprocessing's
"spawn" either: it re-runs the parent's `__main__` in every worker, so a script or notebook
without an `if __name__ == "__main__"` guard would start workers recursively.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

__all__ = ["GradingPool", "Outcome", "Task"]

Task = tuple[str, tuple[Any, ...]]  # (kind, payload); kinds are listed in hacrl.verify.worker

START_TIMEOUT_S = 60.0  # a worker that is not ready by then is killed and replaced
MAX_START_FAILURES = 3  # consecutive failed starts before a call gives up on its items


@dataclass(frozen=True)
class Outcome:
    """What came back for one task."""

    value: bool
    timed_out: bool = False
    error: str | None = None
    latency_s: float = 0.0  # dispatch to result, as the parent saw it


_ROOT = str(Path(__file__).resolve().parents[2])  # the directory that holds `hacrl/`
_BOOT = "import sys; from hacrl.verify.worker import main; main(int(sys.argv[1]), int(sys.argv[2]))"


class _Worker:
    def __init__(self, memory_mb: int) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, str(theirs.fileno()), str(memory_mb)],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            env=env)
        theirs.close()  # only the child holds its end now, so its death shows as EOF here
        self.conn = Connection(ours.detach())
        self.ready = False
        self.started = time.monotonic()
        self.task: int | None = None
        self.dispatched = 0.0
        self.deadline = 0.0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()  # SIGKILL: the worker may be stuck in C code that ignores signals
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.conn.close()


class _Batch:
    """One `run`: its tasks, the items not yet dispatched, the outcomes so far."""

    def __init__(self, tasks: Sequence[Task], timeout_s: float) -> None:
        self.tasks = tasks
        self.timeout_s = timeout_s
        # The worker's own SIGALRM fires a little before the hard kill, so pure-Python runaways
        # end without the cost of a restart.
        self.soft_s = max(timeout_s * 0.8, timeout_s - 0.5)
        self.queue = deque(range(len(tasks)))
        self.results: list[Outcome | None] = [None] * len(tasks)
        self.start_failures = 0  # consecutive failed worker starts

    def finish(self, w: _Worker, outcome: Outcome) -> None:
        assert w.task is not None
        self.results[w.task] = outcome
        w.task = None

    def give_up(self, error: str) -> None:
        """Score every item not yet dispatched 0 with `error`."""
        while self.queue:
            self.results[self.queue.popleft()] = Outcome(False, False, error)
        self.start_failures = 0

    def outcomes(self) -> list[Outcome]:
        return [r if r is not None else Outcome(False, False, "lost") for r in self.results]


_live_pools: weakref.WeakSet[GradingPool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_live_pools):
        pool.close()


class GradingPool:
    """`workers` grading processes; `run` grades a batch with a deadline of `timeout_s` per item.

    Thread-safe (one batch at a time). Counters in `stats`: items, timeouts, deaths (workers
    that died mid-item), unsafe (tripwire refusals), errors, restarts.
    """

    def __init__(self, workers: int = 2, timeout_s: float = 3.0, memory_mb: int = 4096) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.n_workers = workers
        self.timeout_s = float(timeout_s)
        self.memory_mb = memory_mb
        self.stats = {"items": 0, "timeouts": 0, "deaths": 0, "unsafe": 0, "errors": 0,
                      "restarts": 0}
        self.last_outcomes: list[Outcome] = []  # of the latest `run`, for latency reports
        self._workers: list[_Worker] = []
        self._owner = os.getpid()
        self._lock = threading.Lock()
        _live_pools.add(self)

    # -- lifecycle ---------------------------------------------------------------------------

    def _ensure_workers(self) -> None:
        if os.getpid() != self._owner:
            # A forked copy of this object: the processes belong to the parent; start afresh.
            self._workers, self._owner = [], os.getpid()
        while len(self._workers) < self.n_workers:
            self._workers.append(_Worker(self.memory_mb))

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._workers.remove(w)
        self.stats["restarts"] += 1
        self._workers.append(_Worker(self.memory_mb))

    def close(self) -> None:
        """Stop all workers (they are started again on the next `run`)."""
        with self._lock:
            if os.getpid() != self._owner:
                self._workers = []
                return
            for w in self._workers:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
            for w in self._workers:
                try:
                    w.proc.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
                w.kill()
            self._workers = []

    def __enter__(self) -> GradingPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- grading -----------------------------------------------------------------------------

    def run(self, tasks: Sequence[Task], timeout_s: float | None = None) -> list[Outcome]:
        """Outcomes in the order of `tasks`; each task gets at most `timeout_s` (default: pool's)."""
        if not tasks:
            return []
        with self._lock:
            return self._run(tasks, self.timeout_s if timeout_s is None else float(timeout_s))

    def _run(self, tasks: Sequence[Task], timeout_s: float) -> list[Outcome]:
        self._ensure_workers()
        batch = _Batch(tasks, timeout_s)
        while batch.queue or any(w.task is not None for w in self._workers):
            self._replace_idle_dead(batch)
            now = time.monotonic()
            self._dispatch(batch, now)
            ready = self._wait_for_news(now)
            now = time.monotonic()
            for w in list(self._workers):
                self._settle(w, w.conn in ready, now, batch)
            if batch.start_failures >= MAX_START_FAILURES and not any(w.ready for w in self._workers):
                # Workers cannot start here (broken install?): score what is left 0, do not hang.
                batch.give_up("grading workers failed to start")
        out = batch.outcomes()
        self._count(out)
        self.last_outcomes = out
        return out

    def _replace_idle_dead(self, batch: _Batch) -> None:
        """Replace workers that died while idle (killed from outside, or failed to start): no
        item is lost."""
        for w in [w for w in self._workers if w.task is None and not w.alive()]:
            batch.start_failures += 0 if w.ready else 1
            self._replace(w)

    def _dispatch(self, batch: _Batch, now: float) -> None:
        """Hand the next queued items to the ready, idle workers; their deadlines start `now`."""
        for w in self._workers:
            if w.ready and w.task is None and batch.queue:
                i = batch.queue.popleft()
                kind, payload = batch.tasks[i]
                w.task, w.dispatched, w.deadline = i, now, now + batch.timeout_s
                try:
                    w.conn.send((i, kind, payload, batch.soft_s))
                except OSError:
                    pass  # its death shows up as EOF in `_settle`

    def _wait_for_news(self, now: float) -> set[Any]:
        """Sleep until the next result, death or deadline (item, or start-up of a new worker);
        the connections that have something to read."""
        waits = [w.deadline for w in self._workers if w.task is not None]
        waits += [w.started + START_TIMEOUT_S for w in self._workers if not w.ready]
        pause = max(0.0, min(waits, default=now + 1.0) - time.monotonic())
        return set(wait([w.conn for w in self._workers], pause))

    def _settle(self, w: _Worker, readable: bool, now: float, batch: _Batch) -> None:
        """Read `w`'s message if it has one; finish its item on a result, death or overrun, and
        replace it when it died, overran, or did not start in time."""
        dead = False
        if readable:
            # A dead worker's end closes, so death shows up here as EOF (after any
            # reply it managed to send, which still counts).
            try:
                msg = w.conn.recv()
            except (EOFError, OSError):
                dead = True
            else:
                if msg[0] == "ready":
                    w.ready, batch.start_failures = True, 0
                elif w.task is not None and msg[0] == w.task:
                    _, value, timed_out, error = msg
                    batch.finish(w, Outcome(bool(value), bool(timed_out), error,
                                            now - w.dispatched))
        if dead:
            if w.task is not None:
                self.stats["deaths"] += 1
                batch.finish(w, Outcome(False, False, "grading worker died", now - w.dispatched))
            elif not w.ready:
                batch.start_failures += 1
            self._replace(w)
        elif w.task is not None and now >= w.deadline:
            batch.finish(w, Outcome(False, True, "timeout", now - w.dispatched))
            self._replace(w)
        elif not w.ready and now >= w.started + START_TIMEOUT_S:
            batch.start_failures += 1
            self._replace(w)

    def _count(self, outcomes: list[Outcome]) -> None:
        self.stats["items"] += len(outcomes)
        for o in outcomes:
            if o.timed_out:
                self.stats["timeouts"] += 1
            elif o.error is not None and o.error.startswith("unsafe evaluation"):
                self.stats["unsafe"] += 1
            elif o.error is not None:
                self.stats["errors"] += 1
