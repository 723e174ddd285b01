"""The job side of a sweep cell: run it and keep its state file current.

Called by `hacrl.train` when a multirun job carries `cell.id`. The state file says whether the
cell runs (pid, host, log), finished or failed (with the error's first line), and how long the
job itself took, so `hacrl status` can show it from any shell.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hacrl.fileio import write_json
from hacrl.job.lock import Terminated
from hacrl.sweep.state import HEARTBEAT_S, cell_state_path, read_json
from hacrl.sweep.warm import LOG_ENV
from hacrl.tracking import process_token


def _log_path() -> str:
    if os.environ.get(LOG_ENV):  # a warm cell: its log is next to its state
        return os.environ[LOG_ENV]
    try:
        import submitit

        env = submitit.JobEnvironment()
        return str(env.paths.stdout).replace("%t", "0")
    except Exception:  # not under submitit (e.g. Hydra's basic launcher)
        return ""


class Heartbeat:
    """Rewrites the cell's running state every HEARTBEAT_S seconds (a daemon thread), so that a
    sweep on any host can tell a live job from one whose node, memory or time ran out."""

    def __init__(self, path: Path, state: dict[str, Any]) -> None:
        self.path, self.state = path, state
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, name="hacrl-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.write(self.state)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:  # a beat being written finishes first; none starts after
            self._stop.set()
        self._thread.join()

    def write(self, state: dict[str, Any]) -> None:
        with self._lock:
            write_json(self.path, {**state, "heartbeat": time.time()})

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    write_json(self.path, {**self.state, "heartbeat": time.time()})
                except OSError:  # a full or flaky disk: the next beat tries again
                    pass


def run_cell(cfg: DictConfig, sweep_dir: Path) -> dict[str, Any]:
    from hacrl.config import validate
    from hacrl.job import before_job, run_job

    if before_job(cfg) is not None:  # another node of this cell's job trains and keeps its state
        return {"cell": str(cfg.cell.id), "status": "ray worker node"}
    started = time.time()
    path = cell_state_path(sweep_dir, str(cfg.cell.id))
    previous = read_json(path)
    state: dict[str, Any] = {"cell": str(cfg.cell.id), "status": "running", "pid": os.getpid(),
                             "pid_token": process_token(os.getpid()),
                             "host": socket.gethostname(), "log": _log_path(),
                             "started": started, "attempt": int(previous.get("attempt", 0)) + 1}
    with Heartbeat(path, state):
        try:
            summary = run_job(validate(cfg), progress=False)
        except BaseException as err:
            kind = "killed" if isinstance(err, KeyboardInterrupt | Terminated) else "failed"
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            final = {**state, "status": kind, "error": f"{type(err).__name__}: {first}",
                     "ended": time.time(), "seconds": time.time() - started}
            error: BaseException | None = err
        else:
            run = summary.get("job_run_id") or ",".join(
                (summary.get("agent_run_ids") or {}).values())
            final = {**state, "status": "done", "run": run or "", "ended": time.time(),
                     "seconds": time.time() - started, "skipped": bool(summary.get("skipped")),
                     **{k: summary.get(k) for k in ("startup_s", "setup_s", "validation_s",
                                                    "train_s", "eval_s", "tracking_s")}}
            error = None
    write_json(path, final)  # after the heartbeat stopped: it cannot overwrite this
    if error is not None:
        raise error
    return {"cell": str(cfg.cell.id), "status": "done", "run": final["run"]}
