"""Warm cells: a local sweep's cells forked from one process that imported everything once.

A cold cell (one submitit process per cell) spends ~10 s before training: a new interpreter,
torch, transformers, lm-eval and MLflow imported, Hydra and submitit set up, and submitit's
one-second polling. Here a multiprocessing *forkserver* imports those modules once; every cell
is a fresh child forked from it, so it starts in a fraction of a second yet is still its own
process: a cell that crashes, leaks memory or is killed takes nothing else down, nothing of
one cell's state reaches the next, and the server stays clean (no torch op ever runs in it, so
no thread pool exists to be broken by a fork).

The timing cells of Tables 7 and 8 run this way too (alone, after the others), and log what a
cold process would (scripts/bench_timing_cells.py compares them). Their peak RSS is the
child's `ru_maxrss`, which starts at its RSS at the fork: the server's memory, but not the
pages of the files its imports mapped (libtorch's code, ~140 MB), which a child faults in only
as it touches them; every child maps those first (`map_server_pages`), so its RSS starts where
a cold process's does after the same imports. Their seconds are the job's own; a timing cell
also copies the memory it shares with the server before its job starts, which would otherwise
be copied page by page inside the timed job (~0.05 s).

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
PRELOAD = ["torch", "transformers", "mlflow", "mlflow.store.tracking.sqlalchemy_store",
           "lm_eval", "hacrl.job", "hacrl.train",
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

    def launch(self, overrides: list[str], job_num: int, log: Path, timing: bool = False) -> bool:
        """Run one job; True when it completed. Its stdout and stderr are appended to `log`.
        `timing`: a timing cell, which runs alone: its memory is made its own before the job
        starts, so that the job's seconds are a cold process's (`map_server_pages`)."""
        import cloudpickle
        from omegaconf import open_dict

        from hacrl.config import default_kinds

        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config,
                                                                          list(overrides))
        job: Any
        with open_dict(sweep_config.hydra.job) as job:
            job.id = f"warm_{job_num}"
            job.num = job_num
        log.parent.mkdir(parents=True, exist_ok=True)
        # cloudpickle: the task function is the one under @hydra.main, not importable by name;
        # the leaf kinds every job's validation needs, composed here once (not per cell)
        payload = cloudpickle.dumps((self.hydra_context, self.task_function, sweep_config,
                                     default_kinds()))
        child = self.context.Process(target=_child, args=(payload, str(log), timing),
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
    """Have the kernel SIGTERM this process when its parent exits (`faults.die_with_parent`)."""
    from hacrl.core.faults import die_with_parent

    die_with_parent(os.getppid(), signal.SIGTERM)


def populate_supported() -> bool:
    """Whether `map_server_pages` can work here: Linux 5.14 or later (MADV_POPULATE_*)."""
    import platform

    if platform.system() != "Linux":
        return False
    try:
        major, minor = (int(x) for x in platform.release().split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 14)


def map_server_pages(server: int, copy: bool = False) -> int:
    """Map into this process every page of a file that process `server`, its parent, has
    mapped; with `copy`, also copy every page of private memory it shares with it. Returns the
    bytes of the pages handled (Linux 5.14 or later; elsewhere 0, nothing done).

    A forked child's RSS starts with its parent's anonymous memory, but not with the pages of
    the shared libraries (libtorch, ...) and other files its parent's imports mapped: the kernel
    copies no page tables of a file mapping and lets the child fault them in when it touches
    them. Its RSS would start ~140 MB below a cold process's after the same imports, and its
    peak RSS (Table 8) read lower than a cold cell's by the pages the job never touches again.
    These pages are in memory already: mapping them (madvise MADV_POPULATE_READ on the runs
    the parent's pagemap shows present) costs no memory and no I/O, a minor fault each.

    The private memory it shares (the server's heap: Python's objects) is copied on the first
    write to each page, a fault a cold process does not take: ~6,000 pages and ~0.05 s in a
    timing cell's job, ~1-2 % of a tiny one's seconds. `copy` takes them before the job
    (MADV_POPULATE_WRITE on the pages present in the parent: RSS unchanged, ~400 MB of memory
    no longer shared with the server, so only for a cell that runs alone).
    """
    try:
        import ctypes

        import numpy as np

        page = os.sysconf("SC_PAGE_SIZE")
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with open("/proc/self/maps") as own:
            mine = {line.split()[0] for line in own}
        handled = 0
        with open(f"/proc/{server}/maps") as maps, \
                open(f"/proc/{server}/pagemap", "rb", buffering=0) as pagemap:
            for line in maps:
                fields = line.split()
                if fields[0] not in mine or fields[1][0] != "r":
                    continue  # not readable, or not a mapping this process has too
                private = fields[1][1] == "w" and fields[1][3] == "p"
                if copy and private:
                    advice = 23  # MADV_POPULATE_WRITE
                elif len(fields) >= 6 and fields[4] != "0":  # a file
                    advice = 22  # MADV_POPULATE_READ
                else:
                    continue
                start, end = (int(x, 16) for x in fields[0].split("-"))
                pagemap.seek(start // page * 8)
                present = np.frombuffer(pagemap.read((end - start) // page * 8),
                                        dtype=np.uint64) >> np.uint64(63)
                # runs of present pages: [first, last) page indexes
                edges = np.flatnonzero(np.diff(np.concatenate(([0], present, [0])).astype(np.int8)))
                for first, last in zip(edges[::2], edges[1::2], strict=True):
                    size = int(last - first) * page
                    if libc.madvise(start + int(first) * page, size, advice) == 0:
                        handled += size
        return handled
    except (OSError, AttributeError, ValueError, ImportError):
        return 0


def _child(payload: bytes, log: str, timing: bool) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process's own)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ[LOG_ENV] = log
    map_server_pages(os.getppid(), copy=timing)  # the server is this one's parent
    _die_with_parent()
    # SIGTERM as an exception from the first moment (the job installs the same handler once it
    # trains): the cell's state and runs end as killed, not as a silent corpse
    from hacrl.job.lock import on_sigterm

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import cloudpickle
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobStatus, run_job, setup_globals

    from hacrl.config import use_default_kinds

    hydra_context, task_function, sweep_config, kinds = cloudpickle.loads(payload)
    use_default_kinds(kinds)
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


__all__ = ["LOG_ENV", "PRELOAD", "WarmPool", "map_server_pages", "populate_supported"]
