"""One `hacrl sweep`: expand, deduplicate, skip what is done, launch the rest.

Launch: with a local launcher (submitit local, or Hydra's in-process basic one) cells go one job
at a time from each of `parallel` threads, longest first, so a short cell never waits for a long
one; with submitit local each cell is forked from one warm process (`hacrl.sweep.warm`,
`hydra.sweeper.warm=false` for a cold submitit process per cell). With a cluster launcher
(SLURM) all pending cells go as one job array. A failed job is recorded and the others go on.
The timing (cost) cells run last, alone, one at a time, with `cost_threads` threads, and warm
like the others when the sweep is: before its job starts a forked timing cell maps the library
pages its server loaded and copies the memory it shares with it
(`hacrl.sweep.warm.map_server_pages`), so its seconds and peak RSS (Tables 7 and 8) are a cold
process's, without the ~10 s of launch and imports around each.
The report is not the sweep's: the command on top (the sweeper plugin) writes it from the
manifest this writes (`hacrl.schema.sweep_manifest`).
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hacrl.config.ranges import check_leaf_ranges
from hacrl.core.errors import ConfigError, check_writable
from hacrl.core.fileio import write_json
from hacrl.core.layout import Layout, SweepDir
from hacrl.schema.sweep_manifest import SweepManifest, write_manifest
from hacrl.sweep.grid import (
    Cell,
    Compose,
    Expansion,
    all_grids,
    composing_once,
    expand,
    load_report_keys,
    recorded_facts,
)
from hacrl.sweep.grid import sweep_dirs as searched_sweep_dirs
from hacrl.sweep.progress import LiveProgress
from hacrl.sweep.slurm import check_fits, wait_for_jobs
from hacrl.sweep.state import DEADLINE_S, cell_status, format_table
from hacrl.sweep.warm import WarmPool, populate_supported
from hacrl.tracking import Tracker
from hacrl.tracking.mlflow_store import check_store, resolve_uri

LOCAL_LAUNCHERS = ("LocalLauncher", "BasicLauncher")


class SweepFailed(RuntimeError):
    """Some cells failed (the table above says which); the others finished."""


def auto_parallel(threads_per_job: int, mem_per_job_gb: float) -> int:
    """Jobs this machine runs at once: by cores (each job's threads) and by memory."""
    import psutil

    cores = os.cpu_count() or 1
    by_cores = max(1, cores // max(1, threads_per_job))
    by_memory = max(1, int(psutil.virtual_memory().available / 2**30 // max(mem_per_job_gb, 0.1)))
    return min(by_cores, by_memory)


def say(message: str) -> None:
    print(f"[hacrl sweep] {message}", file=sys.stderr, flush=True)


class SweepRun:
    def __init__(self, config: DictConfig, config_loader: Any, launcher: Any,
                 arguments: list[str], name: str, parallel: Any, mem_per_job_gb: float,
                 cost_threads: Any, dry_run: bool = False, warm: bool = True) -> None:
        self.config = config
        self.loader = config_loader
        self.launcher = launcher
        self.arguments = arguments
        self.name = name
        self.parallel_setting = parallel
        self.mem_per_job_gb = mem_per_job_gb
        # the timing cells run alone: by default they get every core (a fixed, recorded count)
        self.cost_threads = (os.cpu_count() or 1) if cost_threads in (None, "auto") \
            else int(cost_threads)
        self.dry_run = dry_run
        # cells of the submitit local launcher fork from one warm process (hacrl.sweep.warm)
        self.pool = WarmPool(launcher) if warm and type(launcher).__name__ == "LocalLauncher" \
            and not dry_run else None
        self.sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        # set by `execute` once the cells are known (what the report is made from)
        self.first: DictConfig | None = None
        self.manifest: SweepManifest | None = None
        self._composing: Compose | None = None

    def own(self, overrides: list[str]) -> list[str]:
        """The cell's overrides less those of a key the command line sets (that one wins)."""
        given = {a.split("=", 1)[0].lstrip("+~") for a in self.arguments}
        return [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in given]

    def with_arguments(self, overrides: list[str]) -> list[str]:
        """The command line's overrides, then the cell's (a key the command line sets wins)."""
        return [*self.arguments, *self.own(overrides)]

    def compose(self, overrides: list[str]) -> DictConfig:
        """A cell's sweep config (the command line's overrides, then the cell's own), each set
        of config-group choices composed once (`grid.composing_once`)."""
        if self._composing is None:
            self._composing = composing_once(self._load, self.sweep_dirs())
        return self._composing(self.own(overrides))

    def _load(self, overrides: list[str]) -> DictConfig:
        cfg = self.loader.load_sweep_config(self.config, [*self.arguments, *overrides])
        assert isinstance(cfg, DictConfig)
        return cfg

    def sweep_dirs(self) -> tuple[Path, ...]:
        """sweeps/, then the `sweep` folder of every file:// entry of hydra.searchpath."""
        return searched_sweep_dirs(self.config.hydra.get("searchpath"))

    def execute(self) -> list[dict[str, Any]]:
        started = time.perf_counter()
        first = self.first = self.compose([])
        check_leaf_ranges(first)  # the command line's values, before anything is written
        output_root = Layout.at(first.output_root).root
        uri = resolve_uri(first.tracking.uri, output_root)
        check_store(uri)  # before the expansion (seconds): a fault is one quick line
        check_writable(output_root)  # (an empty folder: no store is created yet)
        if self.pool is not None:
            self.pool.prepare()
        # every cell's values in range (the expansion checks them) before any store or job
        expansion = expand(self.name, self.compose, self.sweep_dirs())
        cells = expansion.cells
        tracker = Tracker(uri, str(first.tracking.experiment))  # the store exists before any job
        tracker.reap_dead_runs()
        self.manifest = self._manifest(expansion, uri)
        write_manifest(self.sweep_dir, self.manifest)
        say(f"{self.name}: {expansion.asked} cells asked, {len(cells)} distinct "
            f"({expansion.asked - len(cells)} saved by deduplication); store {uri}; "
            f"state in {self.sweep_dir} ({time.perf_counter() - started:.1f} s)")

        before = {c.id: cell_status(c, self.sweep_dir, tracker) for c in cells}
        gone = [cid for cid, row in before.items() if row["status"] == "killed"]
        if gone:
            say(f"{len(gone)} cells whose job is gone (no process, or no heartbeat for "
                f"{DEADLINE_S:.0f} s) run again: {', '.join(gone[:5])}"
                + (" ..." if len(gone) > 5 else ""))
        skipped = {cid for cid, row in before.items() if row["status"] == "done"}
        elsewhere = {cid for cid, row in before.items() if row["status"] == "running"}
        todo = [c for c in cells if c.id not in skipped | elsewhere]
        say(f"{len(skipped)} done already, {len(elsewhere)} running elsewhere, {len(todo)} to run")
        if todo and type(self.launcher).__name__ not in LOCAL_LAUNCHERS:
            try:
                check_fits(self._launcher_settings())  # an impossible request: one line, now
            except ConfigError as err:
                if not self.dry_run:
                    raise
                say(f"warning: SLURM would refuse these jobs: {err}")  # the script still shown
        if self.dry_run:
            rows = self._dry_run([before[c.id] for c in cells], len(todo))
            self._estimate(first, expansion, skipped)
            return rows
        outcome: dict[str, str] = {}
        self.walls: dict[str, float] = {}  # dispatch -> return, per launched cell
        main = sorted((c for c in todo if not c.cost), key=lambda c: -c.estimate)
        cost = [c for c in todo if c.cost]
        index = {c.id: i for i, c in enumerate(cells)}
        threads_per_job = int(first.engine.get("threads") or 1)
        parallel = self._parallel(threads_per_job)
        self.progress = LiveProgress(self.name, [c for c in cells if c.id not in elsewhere],
                                     self.sweep_dir, parallel, skipped)
        with self.progress:
            self._launch(main, index, outcome, parallel, [], self.pool)
            if cost:  # alone, after the others, forked like them when the sweep is warm
                self.progress.note(f"timing cells: {len(cost)} alone, one at a time, "
                                   f"{self.cost_threads} thread(s)")
                # a forked timing cell measures a cold process's peak RSS only where it can
                # map its server's pages (Linux >= 5.14); elsewhere it runs cold, as before
                pool = self.pool if self.pool is not None and populate_supported() else None
                self._launch(cost, index, outcome, 1, [f"engine.threads={self.cost_threads}"],
                             pool, timing=True)

        tracker.reap_dead_runs()
        rows = self._final_rows(cells, tracker, skipped, outcome, started)
        failed = [r for r in rows if r["status"] in ("failed", "killed", "incomplete", "pending")]
        counts = {s: sum(r["status"] == s for r in rows) for s in
                  ("done", "skipped", "failed", "running")}
        say(f"{self.name}: " + ", ".join(f"{n} {s}" for s, n in counts.items()) +
            f" in {time.perf_counter() - started:.0f} s; `hacrl status {self.name}` shows this "
            "table again")
        if elsewhere:
            say(f"{len(elsewhere)} cells were running in other processes (an earlier sweep whose "
                f"jobs outlived it); `hacrl status {self.name}` follows them, and this command "
                "run again later completes the sweep")
        if failed:
            raise SweepFailed(f"{len(failed)} of {len(rows)} cells did not finish: "
                              + ", ".join(f"{r['cell']} ({r['status']})" for r in failed[:10]))
        return rows

    def _dry_run(self, rows: list[dict[str, Any]], todo: int) -> list[dict[str, Any]]:
        """The table of what is done, and the sbatch script the pending cells would get."""
        print(format_table(rows), flush=True)
        if todo and type(self.launcher).__name__ not in LOCAL_LAUNCHERS:
            from hacrl.sweep.slurm import render_sbatch

            launcher = self._launcher_settings()
            folder = str(launcher.get("submitit_folder", self.sweep_dir / ".submitit/%j"))
            print(f"# sbatch script of the job array ({todo} cells):")
            print(render_sbatch(launcher, folder, array_size=todo), flush=True)
        return rows

    def _estimate(self, first: DictConfig, expansion: Expansion, done: set[str]) -> None:
        """The cost estimate of the cells still to run (`hacrl.sweep.cost_plan`)."""
        from omegaconf import OmegaConf

        from hacrl.config import compose
        from hacrl.sweep.cost_plan import calibration_for, format_plan, plan

        local = type(self.launcher).__name__ in LOCAL_LAUNCHERS
        slots = self._parallel(int(first.engine.get("threads") or 1)) if local else None
        calibration = calibration_for(str(first.scale.name), Layout.at(first.output_root).root,
                                      lambda overrides: compose(["scale=paper", *overrides]))
        prices = OmegaConf.select(first, "cost.gpu_hour_usd", default=None)
        prices = {str(k): float(v) for k, v in (prices or {}).items()}
        print(format_plan(plan(expansion.cells, done, calibration, slots, expansion.asked),
                          prices), flush=True)

    def _launcher_settings(self) -> dict[str, Any]:
        from omegaconf import OmegaConf

        launcher = OmegaConf.to_container(self.config.hydra.launcher, resolve=True)
        assert isinstance(launcher, dict)
        return {str(k): v for k, v in launcher.items()}

    def _final_rows(self, cells: list[Cell], tracker: Tracker, skipped: set[str],
                    outcome: dict[str, str], started: float) -> list[dict[str, Any]]:
        """Each cell's row from the artifacts (not from memory), written to status.json."""
        rows = []
        for cell in cells:
            row = cell_status(cell, self.sweep_dir, tracker)
            if cell.id in self.walls:
                row["wall_s"] = self.walls[cell.id]
            if cell.id in skipped:
                row["status"] = "skipped"
            elif row["status"] not in ("done", "killed") and outcome.get(cell.id) == "failed":
                # (a killed job, e.g. scancel, stays "killed": its state file said so)
                row["status"] = "failed"
            rows.append(row)
        write_json(SweepDir(self.sweep_dir).status, {"sweep": self.name, "rows": rows,
                                                     "seconds": time.perf_counter() - started})
        print(format_table(rows), flush=True)
        return rows

    def _manifest(self, expansion: Expansion, uri: str) -> SweepManifest:
        """The record of this sweep: its cells, and what its files name for the report."""
        dirs = self.sweep_dirs()
        keys = load_report_keys(self.name, dirs)
        grids = all_grids(dirs)
        return SweepManifest(
            sweep=self.name, cells=list(expansion.cells), arguments=self.arguments,
            asked=expansion.asked, tracking_uri=uri, created=time.time(),
            tables=list(dict.fromkeys(t for k in keys for t in k.tables)),
            figures=list(dict.fromkeys(f for k in keys for f in k.figures)),
            grids=grids, **recorded_facts(grids, self.compose))

    def _parallel(self, threads_per_job: int) -> int:
        if type(self.launcher).__name__ == "BasicLauncher":
            return 1  # in-process: one job at a time
        if self.parallel_setting in (None, "auto"):
            return auto_parallel(threads_per_job, self.mem_per_job_gb)
        return max(1, int(self.parallel_setting))

    def _launch(self, cells: list[Cell], index: dict[str, int], outcome: dict[str, str],
                parallel: int, extra: list[str], pool: WarmPool | None = None,
                timing: bool = False) -> None:
        if not cells:
            return
        if type(self.launcher).__name__ not in LOCAL_LAUNCHERS:
            self.progress.note(f"submitting {len(cells)} cells as one job array")
            tic, submitted = time.perf_counter(), time.time() - 1.0
            for cell in cells:  # queued or running: the block shows each one's state file
                self.progress.started_cell(cell.id)
            try:
                returns = self.launcher.launch(
                    [self.with_arguments([*c.job_overrides(), *extra]) for c in cells],
                    initial_job_idx=0)
                for cell, ret in zip(cells, returns, strict=True):
                    outcome[cell.id] = "done" if _ok(ret) else "failed"
            except Exception as err:  # a job failed: the table is built from the artifacts
                self.progress.note("job array ended with an error: "
                                   f"{str(err).splitlines()[0] if str(err) else err}")
                for cell in cells:
                    outcome.setdefault(cell.id, "failed")
                # submitit stops at the first job that did not complete: wait for the others
                wait_for_jobs(str(self._launcher_settings().get("submitit_folder", "")),
                              submitted)
            for cell in cells:
                self.progress.finished_cell(cell, outcome[cell.id], time.perf_counter() - tic)
            return
        self.progress.note(f"running {len(cells)} cells, {parallel} at a time" + (
            " (warm: forked from one process that imported everything once)" if pool else ""))
        futures: list[Any] = []

        def one(cell: Cell) -> tuple[Cell, str, float]:
            self.progress.started_cell(cell.id)
            tic = time.perf_counter()
            overrides = self.with_arguments([*cell.job_overrides(), *extra])
            try:
                if pool is not None:
                    ok = pool.launch(overrides, index[cell.id],
                                     SweepDir(self.sweep_dir).cell_log(cell.id), timing)
                else:
                    (ret,) = self.launcher.launch([overrides], initial_job_idx=index[cell.id])
                    ok = _ok(ret)
                return cell, "done" if ok else "failed", time.perf_counter() - tic
            except Exception:
                return cell, "failed", time.perf_counter() - tic

        try:
            with ThreadPoolExecutor(max_workers=parallel) as threads:
                futures = [threads.submit(one, c) for c in cells]
                for future in as_completed(futures):
                    cell, status, seconds = future.result()
                    outcome[cell.id] = status
                    self.walls[cell.id] = seconds
                    self.progress.finished_cell(cell, status, seconds)
        except BaseException:  # Ctrl-C or a kill of the sweep: its warm cells end with it
            if pool is not None:
                for future in futures:
                    future.cancel()
                pool.stop()
            raise


def _ok(ret: Any) -> bool:
    from hydra.core.utils import JobStatus

    return getattr(ret, "status", None) == JobStatus.COMPLETED
