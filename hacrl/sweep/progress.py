"""A sweep's progress while it runs, and the same picture for `hacrl status`.

Each running cell's job writes its phase and step into the cell's state file
(`hacrl.sweep.cell_run`, `hacrl.job.listeners.JobLog`); this module reads them back. On a
terminal `LiveProgress` redraws a block under the finished cells' lines every 2 s: counts
(done / running / pending / failed), elapsed time, ETA, and one line per running cell with its
phase ("training step 12/20", "evaluating") and how long it has run. Elsewhere (a log file, a
pipe) it prints the finished cells' lines and, every minute, the same summary as one line.

The ETA weighs cells by their expected cost (`Cell.estimate`, which the longest-first order
uses too), counts the finished share of running cells (training as 3/4 of a cell, evaluation
the rest), and scales a timing cell's cost by the number of cells that run at once, since it
runs alone.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from hacrl.core.eta import duration, eta_seconds
from hacrl.sweep.grid import Cell
from hacrl.sweep.state import cell_state_path, phase_text, read_json

TRAINING_SHARE = 0.75  # of a training cell's time; the rest is evaluation (tiny and paper)
FINISHED = ("done", "failed", "skipped", "killed", "incomplete")


def done_share(state: dict[str, Any], trains: bool) -> float:
    """The part of a running cell that is behind it (0..1), from its phase and step."""
    phase = state.get("phase")
    if phase == "training" and state.get("steps"):
        return TRAINING_SHARE * min(1.0, int(state.get("step", 0)) / int(state["steps"]))
    if phase == "evaluating":
        return TRAINING_SHARE if trains else 0.0
    return 0.0


class Tally:
    """Counts, and the cost done of the cost to do in this sweep (cells done before it began,
    "skipped", count as done but not in the ETA), for the summary line."""

    def __init__(self, cells: Iterable[Cell], parallel: int) -> None:
        self.weight = {c.id: max(c.estimate, 1e-6) * (parallel if c.cost else 1) for c in cells}

    def summary(self, name: str, statuses: dict[str, str], states: dict[str, dict[str, Any]],
                cells: dict[str, Cell], elapsed: float) -> str:
        counts = {s: 0 for s in ("done", "running", "pending", "failed")}
        done_cost = total = 0.0
        for cid, status in statuses.items():
            key = "failed" if status in ("failed", "killed", "incomplete") else \
                "done" if status in ("done", "skipped") else status
            counts[key] = counts.get(key, 0) + 1
            if status == "skipped":  # done before this sweep started: none of its time
                continue
            total += self.weight.get(cid, 0.0)
            if status in FINISHED:
                done_cost += self.weight.get(cid, 0.0)
            elif status == "running":
                done_cost += self.weight.get(cid, 0.0) * done_share(states.get(cid, {}),
                                                                     cells[cid].trains)
        left = eta_seconds(done_cost, total, elapsed)
        return (f"{name}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n or s != "failed")
                + f" · {duration(elapsed)} elapsed"
                + (f" · ETA {duration(left)}" if left is not None and counts["pending"]
                   + counts["running"] else ""))


def _shown_status(status: str, state: dict[str, Any] | None) -> str:
    """A cell's status in the block: its state file's when finished, pending while the job of
    a cell marked running has not written one yet."""
    if state and state.get("status") in FINISHED:
        return str(state["status"])
    if status == "running" and not state:
        return "pending"
    return status


def running_line(cell: Cell, state: dict[str, Any]) -> str:
    started = state.get("started")
    ran = f"  {duration(time.time() - started)}" if isinstance(started, int | float) else ""
    return f"  running  {cell.id}  {cell.label[:44]:<44}  {phase_text(state)}{ran}"


class LiveProgress:
    """The sweep's progress on `out` while its cells run (see the module docstring)."""

    def __init__(self, name: str, cells: list[Cell], sweep_dir: Path, parallel: int,
                 skipped: Iterable[str] = (), out: TextIO | None = None,
                 tty: bool | None = None) -> None:
        self.name, self.sweep_dir = name, sweep_dir
        self.cells = {c.id: c for c in cells}
        self.status = {c.id: "pending" for c in cells}
        for cid in skipped:
            self.status[cid] = "skipped"
        self.tally = Tally(cells, parallel)
        self.out = out if out is not None else sys.stderr
        self.tty = self.out.isatty() if tty is None else tty
        self.interval = 2.0 if self.tty else 60.0
        self.started = time.time()
        self.finished_count = 0
        self.to_finish = sum(s == "pending" for s in self.status.values())
        self._drawn = 0  # lines of the live block on screen
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hacrl-progress", daemon=True)

    def __enter__(self) -> LiveProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        with self._lock:
            self._clear()

    def started_cell(self, cell_id: str) -> None:
        with self._lock:
            self.status[cell_id] = "running"

    def finished_cell(self, cell: Cell, status: str, seconds: float) -> None:
        with self._lock:
            self.status[cell.id] = status
            self.finished_count += 1
            self._clear()
            self._write(f"[hacrl sweep] [{self.finished_count}/{self.to_finish}] {status:<6} "
                        f"{cell.id} {cell.label} ({seconds:.0f} s)")
            if self.tty:
                self._draw()

    def note(self, message: str) -> None:
        """A line of the sweep's own, written above the block (not through it)."""
        with self._lock:
            self._clear()
            self._write(f"[hacrl sweep] {message}")
            if self.tty:
                self._draw()

    def lines(self) -> list[str]:
        """The block: the summary line, then one line per running cell."""
        states = {cid: read_json(cell_state_path(self.sweep_dir, cid))
                  for cid, s in self.status.items() if s == "running"}
        # a job array's cells end while the launcher waits for all of them: their state files
        # say so first; a cell submitted whose job has not begun (no state file: SLURM keeps it
        # queued) is pending, as `hacrl status` and squeue say, not running
        status = {cid: _shown_status(s, states.get(cid)) for cid, s in self.status.items()}
        head = self.tally.summary(self.name, status, states, self.cells,
                                  time.time() - self.started)
        return [f"[hacrl sweep] {head}",
                *(running_line(self.cells[cid], st) for cid, st in states.items()
                  if status[cid] == "running")]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                if self.tty:
                    self._clear()
                    self._draw()
                else:
                    self._write(" | ".join(" ".join(line.split()) for line in self.lines()))

    def _draw(self) -> None:
        block = self.lines()
        self.out.write("\n".join(block) + "\n")
        self.out.flush()
        self._drawn = len(block)

    def _clear(self) -> None:
        if self.tty and self._drawn:
            self.out.write(f"\x1b[{self._drawn}F\x1b[J")  # up to the block's start, erase below
            self._drawn = 0

    def _write(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()


__all__ = ["LiveProgress", "Tally", "done_share", "running_line"]
