"""The job side of a sweep cell: run it and keep its state file current.

Called by `hacrl.train` when a multirun job carries `cell.id`. The state file says whether the
cell runs (pid, host, log), finished or failed (with the error's first line), and how long the
job itself took, so `hacrl status` can show it from any shell.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hacrl.sweep.state import cell_state_path, read_json, write_json


def _log_path() -> str:
    try:
        import submitit

        env = submitit.JobEnvironment()
        return str(env.paths.stdout).replace("%t", "0")
    except Exception:  # not under submitit (e.g. Hydra's basic launcher)
        return ""


def run_cell(cfg: DictConfig, sweep_dir: Path) -> dict[str, Any]:
    from hacrl.config import validate
    from hacrl.job import before_job, run_job

    if before_job(cfg) is not None:  # another node of this cell's job trains and keeps its state
        return {"cell": str(cfg.cell.id), "status": "ray worker node"}
    started = time.time()
    path = cell_state_path(sweep_dir, str(cfg.cell.id))
    previous = read_json(path)
    state: dict[str, Any] = {"cell": str(cfg.cell.id), "status": "running", "pid": os.getpid(),
                             "host": socket.gethostname(), "log": _log_path(),
                             "started": started, "attempt": int(previous.get("attempt", 0)) + 1}
    write_json(path, state)
    try:
        summary = run_job(validate(cfg), progress=False)
    except BaseException as err:
        kind = "killed" if isinstance(err, KeyboardInterrupt) or type(err).__name__ == \
            "_Terminated" else "failed"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        write_json(path, {**state, "status": kind, "error": f"{type(err).__name__}: {first}",
                          "ended": time.time(), "seconds": time.time() - started})
        raise
    run = summary.get("job_run_id") or ",".join((summary.get("agent_run_ids") or {}).values())
    write_json(path, {**state, "status": "done", "run": run or "", "ended": time.time(),
                      "seconds": time.time() - started, "skipped": bool(summary.get("skipped")),
                      **{k: summary.get(k) for k in ("startup_s", "setup_s", "validation_s",
                                                     "train_s", "eval_s", "tracking_s")}})
    return {"cell": str(cfg.cell.id), "status": "done", "run": run}
