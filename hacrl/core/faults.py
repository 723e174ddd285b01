"""Named points where a test can kill this process, to prove every state a kill leaves is
repaired by the next run. `HACRL_FAULT=<point>` SIGKILLs the process when it reaches <point>
(nothing runs after: no finally, no atexit), like an OOM killer or a lost node would.
`die_with_parent`: a worker process never outlives the command that started it."""

from __future__ import annotations

import os
import signal

ENV = "HACRL_FAULT"
# The finishing sequence of a training job, in order (hacrl.job, hacrl.sweep.cell_run).
FINISHING = ("final_checkpoint", "final_eval", "done_json", "job_metrics", "agent_runs_finished",
             "job_run_finished")


# Faults that are not this process's death: `armed(name)` says the caller should cause one.
ROLLOUT_ENGINE = "rollout_engine"  # SIGKILL the vLLM engine processes under a rollout in flight


def armed(name: str) -> bool:
    """`HACRL_FAULT=<name>` asks for the fault `name` here (said on stderr, like `point`)."""
    if os.environ.get(ENV) != name:
        return False
    os.write(2, f"hacrl: {ENV}={name}: causing this fault on purpose (fault test)\n".encode())
    return True


def point(name: str) -> None:
    if os.environ.get(ENV) == name:
        # said first: a HACRL_FAULT left in a shell must not look like a mysterious crash
        os.write(2, f"hacrl: {ENV}={name}: killing this process on purpose (fault test)\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send `sig` to this process when its parent exits, however it exits
    (Linux's parent-death signal; elsewhere nothing). `parent`: the pid the caller was started
    by; if it is already gone (it died before this ran), this process exits at once."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)
