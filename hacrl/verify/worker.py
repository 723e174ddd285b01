"""The grading worker process: loads math-verify, arms the tripwire, answers tasks on a Pipe.

Protocol (all pickled over one duplex `Connection`):

* worker -> parent once: ``("ready", pid)`` after imports, warm-up and the tripwire;
* parent -> worker: ``(task_id, kind, payload, soft_s)``, or ``None`` to exit;
* worker -> parent: ``(task_id, value, timed_out, error)``.

Kinds: ``grade`` (payload ``(pred, gold)``, value: math-verify's verdict), and two debug kinds
the tests use: ``_sleep`` (payload ``(seconds,)``; ignores the soft deadline so that only the
parent's hard kill can end it) and ``_probe_tripwire`` (payload ``(text,)``; sympifies ``text``
and reports whether the tripwire refused it).

The soft deadline (`soft_s`, a little under the parent's hard one) interrupts pure-Python work
with SIGALRM so the worker can report a timeout and stay alive; computations stuck inside C code
ignore it, and those are what the parent's SIGKILL is for.
"""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

from hacrl.verify.equivalence import load_math_verify, math_verify_equal
from hacrl.verify.tripwire import UnsafeEvaluation, install

__all__ = ["main", "serve"]

Reply = tuple[bool, bool, "str | None"]  # (value, timed_out, error)


class _SoftDeadline(BaseException):
    """Raised by SIGALRM; a BaseException so library ``except Exception`` blocks let it pass."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _SoftDeadline


def _limit_memory(memory_mb: int) -> None:
    """Cap the address space so a runaway expression fails with MemoryError, not the host's OOM."""
    if memory_mb <= 0:
        return
    try:
        import resource

        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass  # not available on this platform: the hard kill still bounds time


def _run(kind: str, payload: tuple[Any, ...]) -> Reply:
    if kind == "grade":
        pred, gold = payload
        return math_verify_equal(pred, gold), False, None
    if kind == "_sleep":
        time.sleep(float(payload[0]))
        return True, False, None
    if kind == "_probe_tripwire":
        import sympy

        sympy.sympify(payload[0])
        return True, False, None
    return False, False, f"unknown task kind {kind!r}"


def _answer(kind: str, payload: tuple[Any, ...], soft_s: float) -> Reply:
    use_alarm = soft_s > 0 and kind != "_sleep"
    try:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, soft_s)
        try:
            return _run(kind, payload)
        finally:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except _SoftDeadline:
        return False, True, "timeout"
    except UnsafeEvaluation as exc:
        return False, False, f"unsafe evaluation: {exc}"
    except RecursionError:
        return False, False, "RecursionError"
    except Exception as exc:  # any library failure is a wrong answer, never a dead worker
        return False, False, f"{type(exc).__name__}: {str(exc)[:200]}"


def main(fd: int, memory_mb: int) -> None:
    """Entry point of a worker interpreter: serve on the socket inherited as file descriptor `fd`.
    It ends with the process that started it, however that one ends (mid-grade too: a closed
    socket is only seen between items)."""
    from hacrl.core.faults import die_with_parent

    die_with_parent(os.getppid())
    serve(Connection(fd), memory_mb)


def serve(conn: Connection, memory_mb: int) -> None:
    """Worker main loop."""
    # The parent handles Ctrl-C; a worker dying on it mid-batch would only add noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SLURM sends a job's USR2 (time limit near, preemption) to every process of its steps:
    # the job decides what it means (hacrl.job.requeue); a worker would only die of it
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, _on_alarm)
    _limit_memory(memory_mb)
    load_math_verify()
    install()
    math_verify_equal("\\frac{1}{2}", "0.5")  # warm the grammar and caches before saying ready
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # parent went away
        if msg is None:
            return
        task_id, kind, payload, soft_s = msg
        value, timed_out, error = _answer(kind, payload, soft_s)
        try:
            conn.send((task_id, value, timed_out, error))
        except (BrokenPipeError, OSError):
            return
