"""Named points where a test can kill this process, to prove every state a kill leaves is
repaired by the next run. `HACRL_FAULT=<point>` SIGKILLs the process when it reaches <point>
(nothing runs after: no finally, no atexit), like an OOM killer or a lost node would."""

from __future__ import annotations

import os
import signal

ENV = "HACRL_FAULT"
# The finishing sequence of a training job, in order (hacrl.job, hacrl.sweep.cell_run).
FINISHING = ("final_checkpoint", "final_eval", "done_json", "job_metrics", "agent_runs_finished",
             "job_run_finished")


def point(name: str) -> None:
    if os.environ.get(ENV) == name:
        # said first: a HACRL_FAULT left in a shell must not look like a mysterious crash
        os.write(2, f"hacrl: {ENV}={name}: killing this process on purpose (fault test)\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
