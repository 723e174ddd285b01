"""Warm cells: a local sweep's cells forked from one process that imported everything once.

A cold cell (one submitit process per cell) spends ~10 s before training: a new interpreter,
torch, transformers, lm-eval and MLflow imported, Hydra and submitit set up, and submitit's
one-second polling. Here a multiprocessing *forkserver* imports those modules once; every cell
is a fresh child forked from it, so it starts in a fraction of a second yet is still its own
process: a cell that crashes, leaks memory or is killed takes nothing else down, nothing of
one cell's state reaches the next, and the server stays clean (no torch op ever runs in it, so
no thread pool exists to be broken by a fork).

The child does what Hydra's launchers do for a multirun job: the cell's config composed by the
sweep, the job's globals set, `hydra.core.utils.run_job` with the task function (so the job's
folder, `.hydra/` files and `hydra.job.num` are as under any launcher). Its stdout and stderr
go to the cell's log file next to its state, and it ends with its parent's forkserver.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

# what every cell imports anyway; a module missing here is imported by the cell itself
PRELOAD = ["torch", "transformers", "mlflow", "lm_eval", "hacrl.job", "hacrl.train",
           "hacrl.sweep.cell_run", "hacrl.evaluation.runner", "hacrl.evaluation.hf_lm",
           "hacrl.engines.local"]
LOG_ENV = "HACRL_CELL_LOG"  # cell_run records it as the cell's log


class WarmPool:
    """Runs Hydra jobs as children of one warm forkserver; `launch` blocks until the job ends.

    `launcher` is the sweep's Hydra launcher after `setup` (its hydra_context, task_function and
    config are what any launcher would use). Safe to call from several threads at once.
    """

    def __init__(self, launcher: Any) -> None:
        self.hydra_context = launcher.hydra_context
        self.task_function = launcher.task_function
        self.config = launcher.config
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(PRELOAD)
        self._live: set[Any] = set()
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Start the forkserver and its imports (seconds) in the background, so they overlap
        with the sweep's own work (expansion, state) instead of delaying the first cells."""
        from multiprocessing import forkserver

        threading.Thread(target=forkserver.ensure_running, name="hacrl-warm-start",
                         daemon=True).start()

    def launch(self, overrides: list[str], job_num: int, log: Path) -> bool:
        """Run one job; True when it completed. Its stdout and stderr are appended to `log`."""
        import cloudpickle
        from omegaconf import open_dict

        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config,
                                                                          list(overrides))
        job: Any
        with open_dict(sweep_config.hydra.job) as job:
            job.id = f"warm_{job_num}"
            job.num = job_num
        log.parent.mkdir(parents=True, exist_ok=True)
        # cloudpickle: the task function is the one under @hydra.main, not importable by name
        payload = cloudpickle.dumps((self.hydra_context, self.task_function, sweep_config))
        child = self.context.Process(target=_child, args=(payload, str(log)),
                                     name=f"hacrl-cell-{job_num}")
        with self._lock:
            child.start()
            self._live.add(child)
        try:
            child.join()
        finally:
            with self._lock:
                self._live.discard(child)
        return child.exitcode == 0

    def stop(self) -> None:
        """End every running cell (SIGTERM: each marks itself killed) and wait for them."""
        with self._lock:
            live = list(self._live)
        for child in live:
            if child.is_alive():
                child.terminate()
        for child in live:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()


def _die_with_parent() -> None:
    """SIGTERM this process when its parent (the forkserver) exits, as when the sweep that owns
    the forkserver is gone: an orphaned cell would otherwise train on unseen (Linux only).

    The forkserver lives while anyone holds the write end of its "alive" pipe: the sweep, and
    every child (multiprocessing hands each one a copy, to keep its server up while it runs).
    A cell's copy is closed here, so the server ends with the sweep however the sweep ends
    (SIGKILL included), and with it, through the death signal, its cells.
    """
    from multiprocessing import forkserver

    alive = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_alive_fd", None)
    if alive is not None:
        try:
            os.close(alive)
        except OSError:
            pass
        forkserver._forkserver._forkserver_alive_fd = None  # type: ignore[attr-defined]
    term_with_parent()


def term_with_parent() -> None:
    """Have the kernel SIGTERM this process when its parent exits (Linux's parent-death
    signal; elsewhere nothing)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child(payload: bytes, log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process's own)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ[LOG_ENV] = log
    _die_with_parent()
    # SIGTERM as an exception from the first moment (the job installs the same handler once it
    # trains): the cell's state and runs end as killed, not as a silent corpse
    from hacrl.job.lock import on_sigterm

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import cloudpickle
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobStatus, run_job, setup_globals

    hydra_context, task_function, sweep_config = cloudpickle.loads(payload)
    setup_globals()
    HydraConfig.instance().set_config(sweep_config)
    ret = run_job(hydra_context=hydra_context, task_function=task_function, config=sweep_config,
                  job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    if ret.status != JobStatus.COMPLETED:
        error = ret._return_value
        traceback.print_exception(type(error), error, error.__traceback__)
    # a normal exit (not os._exit): multiprocessing's finalizers run, so the semaphores the
    # cell made (tqdm's lock, ...) are released instead of reported as leaked by the tracker
    sys.exit(0 if ret.status == JobStatus.COMPLETED else 1)


__all__ = ["LOG_ENV", "PRELOAD", "WarmPool"]
