"""A sweep's cost before it runs (`hacrl plan`, the dry run): each cell's seconds from the cost
model (`hacrl.sweep.cost_model`), calibrated on what this output root has measured at the same
scale, else on the shipped calibration (tiny: `calibration_tiny.json`, measured on a 2-core
machine by `scripts/calibrate_cost.py`; paper: the paper's Table 7), and the sweep's wall time
on its slots with the error the calibration states.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from omegaconf import DictConfig

from hacrl.core.errors import HacrlError
from hacrl.core.eta import duration
from hacrl.core.layout import Layout, SweepDir
from hacrl.schema.sweep_manifest import CellRecord, read_manifest
from hacrl.sweep.cost_model import (
    TABLE7_GPUS,
    TABLE7_MINUTES,
    UNITS,
    Calibration,
    cell_work,
    fit,
    makespan,
)

MIN_MEASURED = 8  # measured cells a calibration of this root's own needs
PAPER_UNITS = ("generate", "train", "updates", "agents")  # what Table 7's 7 rows can tell
TINY_FILE = "calibration_tiny.json"


def measured_rows(output_root: Path, scale: str) -> list[tuple[dict[str, float], float]]:
    """(work, seconds) of every finished cell the sweeps under `output_root` ran at `scale`:
    the seconds from launch to return the sweep recorded (status.json; local launchers), else
    the seconds the cell's job recorded in its state file (a SLURM array's cells, and cells an
    earlier run of the sweep finished), for cells whose manifest holds their work (sweeps
    written since the cost model)."""
    rows: dict[str, tuple[dict[str, float], float]] = {}
    sweeps = Layout(output_root).sweeps
    for folder in sorted(sweeps.iterdir()) if sweeps.is_dir() else []:
        try:
            manifest = read_manifest(folder)
            status = json.loads(SweepDir(folder).status.read_text())
        except (OSError, ValueError, HacrlError):  # not finished yet, or another hacrl's
            continue
        if manifest is None:
            continue
        walls = {r.get("cell"): r.get("wall_s") or r.get("seconds")
                 for r in status.get("rows", []) if r.get("status") in ("done", "skipped")}
        for cell in manifest.cells:
            wall = walls.get(cell.id)
            if cell.scale == scale and cell.work and isinstance(wall, int | float) and wall > 0:
                rows[cell.id] = (dict(cell.work), float(wall))  # a cell measured twice: latest
    return list(rows.values())


def tiny_calibration() -> Calibration:
    """The shipped tiny calibration (`scripts/calibrate_cost.py --write` made it)."""
    data = json.loads(resources.files("hacrl.sweep").joinpath(TINY_FILE).read_text())
    return Calibration(data["seconds_per_unit"], data["source"], int(data["rows"]),
                       [float(e) for e in data["loo_errors"]], data.get("loo_total_error"))


def paper_calibration(compose_paper: Callable[[list[str]], DictConfig]) -> Calibration:
    """Seconds per unit fitted to the paper's Table 7: the `cost` sweep's timing cells composed
    at paper scale (`compose_paper`), each row's work against its published minutes. Table 7
    has no evaluation: evaluation tokens are priced as rollout tokens (both are vLLM
    generation)."""
    from hacrl.sweep.grid import SWEEP_DIR, expand

    rows: list[tuple[dict[str, float], float]] = []
    names: list[str] = []
    for cell in expand("cost", compose_paper, (SWEEP_DIR,)).cells:
        if cell.params.get("timing_repeat") not in (0, None):
            continue
        key = (cell.method, cell.agents[0] if len(cell.agents) == 1 else "total")
        if key in TABLE7_MINUTES:
            rows.append((cell_work(compose_paper(cell.overrides), cell.agents, []),
                         TABLE7_MINUTES[key] * 60.0))
            names.append(" ".join(key))
    calibration = fit(rows, f"the paper's Table 7 ({len(rows)} rows, {TABLE7_GPUS} GPUs)",
                      PAPER_UNITS, names)
    calibration.seconds_per_unit["evaluate"] = calibration.seconds_per_unit["generate"]
    return calibration


def calibration_for(scale: str, output_root: Path,
                    compose_paper: Callable[[list[str]], DictConfig]) -> Calibration:
    """This root's own measured cells at `scale` when it has enough, else the shipped one."""
    rows = measured_rows(output_root, scale)
    if len(rows) >= MIN_MEASURED:
        return fit(rows, f"{len(rows)} cells measured in {output_root} at scale={scale}", UNITS)
    if scale == "paper":
        return paper_calibration(compose_paper)
    return tiny_calibration()


@dataclass
class CellCost:
    cell: CellRecord
    seconds: float
    gpus: int
    done: bool


@dataclass
class Plan:
    cells: list[CellCost]
    calibration: Calibration
    slots: int | None       # parallel local slots; None: a SLURM array (every cell at once)
    asked: int

    def remaining(self) -> list[CellCost]:
        return [c for c in self.cells if not c.done]

    def wall_s(self) -> float:
        """The remaining cells' wall time: the others on the slots longest first, then the
        timing cells alone; on SLURM every cell at once (the longest one)."""
        todo = self.remaining()
        main = [c.seconds for c in todo if not c.cell.cost]
        timing = sum(c.seconds for c in todo if c.cell.cost)
        first = max(main, default=0.0) if self.slots is None else makespan(main, self.slots)
        return first + timing

    def gpu_hours(self) -> float:
        return sum(c.seconds * c.gpus for c in self.remaining()) / 3600.0


def plan(cells: Sequence[CellRecord], done: set[str], calibration: Calibration,
         slots: int | None, asked: int) -> Plan:
    costs = [CellCost(c, calibration.predict(c.work), c.gpus, c.id in done) for c in cells]
    return Plan(costs, calibration, slots, asked)


def _money(gpu_hours: float, prices: dict[str, float]) -> str:
    if not prices or gpu_hours <= 0:
        return ""
    low, high = min(prices.values()), max(prices.values())
    span = f"${gpu_hours * low:,.0f}" if low == high else \
        f"${gpu_hours * low:,.0f}-${gpu_hours * high:,.0f} (cost.gpu_hour_usd: " \
        f"{', '.join(f'{k} ${v:g}' for k, v in prices.items())})"
    return f", {span}"


def format_plan(p: Plan, prices: dict[str, float] | None = None) -> str:
    """The estimate: one line per method, the total, and where the numbers come from."""
    error = p.calibration.typical_error()
    pm = f" ± {error:.0%}" if error is not None else ""
    by_method: dict[str, list[CellCost]] = {}
    for c in p.remaining():
        by_method.setdefault(c.cell.method + (" (timing)" if c.cell.cost else ""), []).append(c)
    width = max([len(m) for m in by_method] + [6])
    lines = [f"estimate: seconds per unit from {p.calibration.source}; "
             f"{p.calibration.error_summary()}",
             f"  {'method':<{width}}  cells  per cell      cell time   GPU-hours"]
    for method, costs in by_method.items():
        seconds = [c.seconds for c in costs]
        each = (duration(min(seconds)) if min(seconds) == max(seconds) else
                f"{duration(min(seconds))}-{duration(max(seconds))}")
        gpu_h = sum(c.seconds * c.gpus for c in costs) / 3600.0
        lines.append(f"  {method:<{width}}  {len(costs):>5}  {each:<12}  "
                     f"{duration(sum(seconds)):>9}   {gpu_h:>9.1f}")
    for name, measured, fitted, loo in p.calibration.checks:
        lines.append(f"  check: {name}: measured {duration(measured)}, fitted "
                     f"{duration(fitted)} ({fitted / measured - 1:+.0%}), left out "
                     f"{duration(loo)} ({loo / measured - 1:+.0%})")
    done = sum(c.done for c in p.cells)
    where = "every cell at once (a SLURM array with room for all)" if p.slots is None else \
        f"{p.slots} at a time, longest first, timing cells alone after"
    gpu_h = p.gpu_hours()
    total = p.calibration.loo_total_error
    summed = "" if total is None else \
        f"; summed over its own cells, left out one at a time, the fit was off by {total:+.0%}"
    lines.append(f"  total: {len(p.cells)} distinct cells ({p.asked} asked), {done} done, "
                 f"{len(p.remaining())} to run; wall ≈ {duration(p.wall_s())}{pm} ({where}); "
                 + (f"{gpu_h:,.1f} GPU-hours{pm}{_money(gpu_h, prices or {})}" if gpu_h
                    else "no GPUs"))
    lines.append(f"  (± is the calibration's median error per cell{summed})")
    return "\n".join(lines)
