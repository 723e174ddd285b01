"""What a sweep cost, measured: per cell, per method, per sweep file (the table it feeds) and in
total. Every report carries this table (`cost`), and `hacrl status` prints its total so far.

A cell counts its latest finished run (the job run; a base model's evaluation runs), as the
other tables do: the `cost/` metrics jobs log (`hacrl.job.usage`), wall seconds from `time/`
(`time/startup_s` + `time/wall_s`: the job process's whole life) and peak memory from
`memory/`. Runs logged before the `cost/` family existed have only their wall seconds (a base
model's evaluation run: the seconds of its evaluations, `time/eval_<protocol>_s`): what they
lack is shown as missing, never as 0. Seconds are shown in hours, or in seconds where all the
cells together took under an hour (the column names say which). Sums are sums over cells; peak
memory is the largest cell's. A group with some cells missing a value shows the sum of the
others and says how many lack it. Money is what jobs logged as `cost/usd` (GPU-hours x
`cost.gpu_hour_usd` of their GPU type, priced when the job ran); the column appears when any
job was priced.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from analysis.cell_values import REASONS, Value, cell_runs
from analysis.context import Context
from analysis.store import Store
from analysis.table import Entry, Table
from hacrl.schema import metric_names as M
from hacrl.schema import tags as T
from hacrl.schema.sweep_manifest import CellRecord

# column -> (label, digits); "peak_gb" is a maximum, every other column a sum. The seconds
# columns are shown in hours, or in seconds in a table whose cells took under an hour in all
COLUMNS = {"wall_s": ("wall", 1), "cpu_s": ("CPU", 1), "gpu_s": ("GPU", 1),
           "peak_gb": ("peak RSS GB (max)", 2), "tokens_sampled": ("tokens sampled", 0),
           "tokens_trained": ("tokens trained", 0), "usd": ("USD", 2)}
SECONDS = ("wall_s", "cpu_s", "gpu_s")
PEAK = "peak_gb"
OLDER = "not logged (older run)"
HOUR = 3600.0


@dataclass
class CellCost:
    """One cell's measured cost: a value per column, or why there is none."""

    cell: CellRecord
    values: dict[str, float] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # column -> reason
    run_ids: list[str] = field(default_factory=list)
    gpu_types: set[str] = field(default_factory=set)

    def value(self, column: str, scale: float = 1.0) -> Value:
        """`column`'s value (divided by `scale`: seconds to hours), or why there is none."""
        if column in self.values:
            return Value([self.values[column] / scale], list(self.run_ids))
        return Value(run_ids=list(self.run_ids), reason=self.missing.get(column, "not run"))


def _number(row: pd.Series, metric: str) -> float | None:
    value = row.get(metric)
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _run_values(row: pd.Series, cell: CellRecord) -> tuple[dict[str, float], dict[str, str]]:
    """One finished run's values per column, and why the others are missing."""
    values: dict[str, float] = {}
    missing: dict[str, str] = {}
    trains = cell.trains
    wall, startup = _number(row, M.WALL), _number(row, M.STARTUP)
    if wall is None and not trains:  # an older base evaluation: its evaluations' seconds
        found = [s for p in cell.protocols if (s := _number(row, M.eval_seconds(p))) is not None]
        wall = math.fsum(found) if found else None
    if wall is not None:
        values["wall_s"] = wall + (startup or 0.0)
    else:
        missing["wall_s"] = "not logged"
    logged = _number(row, M.CPU_S) is not None  # the run knows the cost/ family
    for column, metric in (("cpu_s", M.CPU_S), ("gpu_s", M.GPU_S), (PEAK, M.PEAK_RSS),
                           ("tokens_sampled", M.TOKENS_SAMPLED),
                           ("tokens_trained", M.TOKENS_TRAINED), ("usd", M.USD)):
        number = _number(row, metric)
        if number is not None:
            values[column] = number
        elif column.startswith("tokens") and not trains:
            missing[column] = "evaluation only"
        elif column == "usd" and logged:
            missing[column] = "not priced" if (_number(row, M.GPUS) or 0) > 0 else "no GPUs"
        else:
            missing[column] = OLDER if not logged else "not logged"
    return values, missing


def cell_cost(store: Store, cell: CellRecord) -> CellCost:
    """The cell's cost from its latest finished run (a base cell: each agent's evaluation run,
    summed); a cell without one says why (not run, running, failed, ...)."""
    out = CellCost(cell)
    parts = [cell_runs(store, cell, agent) for agent in cell.agents] if not cell.trains \
        else [cell_runs(store, cell, None)]
    for runs in parts:
        done = runs[runs["status"] == "FINISHED"] if not runs.empty else runs
        if done.empty:
            reason = "not run" if runs.empty else \
                REASONS.get(str(runs.iloc[0]["status"]), str(runs.iloc[0]["status"]).lower())
            out.values.clear()
            out.missing = dict.fromkeys(COLUMNS, reason)
            out.run_ids += [str(r) for r in runs["run_id"][:1]]
            return out
        row = done.iloc[0]
        out.run_ids.append(str(row["run_id"]))
        if isinstance(row.get(T.GPU_TYPE), str) and row.get(T.GPU_TYPE):
            out.gpu_types.add(str(row[T.GPU_TYPE]))
        values, missing = _run_values(row, cell)
        for column in COLUMNS:
            if column in out.missing:
                continue  # an earlier part lacks it: the cell's sum would be a part only
            if column in values:
                have = out.values.get(column)
                out.values[column] = values[column] if have is None else \
                    (max(have, values[column]) if column == PEAK else have + values[column])
            else:
                out.values.pop(column, None)
                out.missing[column] = missing[column]
    return out


def total(costs: Iterable[CellCost], column: str, scale: float = 1.0) -> Value:
    """The group's sum (peak memory: maximum) of `column`, divided by `scale`; each run counted
    once (cells that share a base model's evaluation run), the cells that lack it said in
    `reason`."""
    seen: set[tuple[str, ...]] = set()
    present: list[float] = []
    run_ids: list[str] = []
    lacking: dict[str, int] = {}
    count = 0
    for cost in costs:
        key = tuple(sorted(cost.run_ids))
        if cost.run_ids and key in seen:
            continue
        seen.add(key)
        count += 1
        if column in cost.values:
            present.append(cost.values[column])
            run_ids += cost.run_ids
        else:
            reason = cost.missing.get(column, "not run")
            lacking[reason] = lacking.get(reason, 0) + 1
    why = ", ".join(f"{n} of {n_cells(count)} {r}" for r, n in lacking.items())
    if not present:
        return Value(reason=why or "no cells")
    value = max(present) if column == PEAK else math.fsum(present)
    return Value([value / scale], run_ids, reason=why)


def n_cells(n: int) -> str:
    """`1 cell`, `3 cells`."""
    return f"{n} cell" if n == 1 else f"{n} cells"


def sweep_costs(store: Store, cells: Iterable[CellRecord]) -> list[CellCost]:
    return [cell_cost(store, c) for c in cells]


def cell_label(cell: CellRecord) -> str:
    timing = f" · timing {cell.params.get('timing_repeat', 0)}" if cell.cost else ""
    return f"{cell.method} · {'+'.join(cell.agents)} · seed {cell.seed}{timing} ({cell.id})"


def cost_table(ctx: Context) -> Table:
    """The report's `cost` table: total, per sweep file, per method, per cell."""
    costs = sweep_costs(ctx.store, ctx.cells)
    priced = any("usd" in c.values for c in costs)
    columns = [k for k in COLUMNS if k != "usd" or priced]
    hours = (total(costs, "wall_s").mean or 0.0) >= HOUR
    unit, digits = ("h", 3) if hours else ("s", 1)

    def label(k: str) -> str:
        return f"{COLUMNS[k][0]} {unit}" if k in SECONDS else COLUMNS[k][0]

    def entry(value: Value, k: str) -> Entry:
        return Entry(value, None, digits=digits if k in SECONDS else COLUMNS[k][1],
                     compare=False)

    def scale(k: str) -> float:
        return HOUR if hours and k in SECONDS else 1.0

    table = Table("cost", "Measured cost — wall, CPU and GPU time, peak memory, tokens: in "
                  "total, per sweep file (the table it feeds), per method and per cell",
                  [label(k) for k in columns])

    def row(section: str, name: str, group: list[CellCost]) -> None:
        table.add(section, name, [entry(total(group, k, scale(k)), k) for k in columns])

    row("total", f"all {n_cells(len(costs))}", costs)
    sweeps = list(dict.fromkeys(s for c in ctx.cells for s in c.sweeps))
    for sweep in sweeps:
        group = [c for c in costs if sweep in c.cell.sweeps]
        row("per sweep file", f"{sweep} ({n_cells(len(group))})", group)
    for method in dict.fromkeys(c.method for c in ctx.cells):
        group = [c for c in costs if c.cell.method == method]
        row("per method", f"{method} ({n_cells(len(group))})", group)
    for cost in costs:
        table.add("per cell", cell_label(cost.cell),
                  [entry(cost.value(k, scale(k)), k) for k in columns])
    types = sorted({t for c in costs for t in c.gpu_types})
    table.notes += [
        "Measured once per run: sums (peak memory: the largest), no interval. A cell counts its "
        "latest finished run; failed or killed attempts, and the processes of a job before it "
        "was resumed, are not counted.",
        "wall: time/startup_s + time/wall_s of the job process; CPU: user + system seconds of "
        "the job process and its child processes (Ray workers outside this process tree, e.g. "
        "on other nodes, are missed); GPU: the GPUs the job held (SLURM's allocation, "
        "CUDA_VISIBLE_DEVICES, or what torch saw) x the process's seconds.",
        "tokens: response tokens the agents sampled, and trained on (their own and borrowed), "
        "summed over steps; evaluation's tokens are not counted.",
        f"Runs logged before cost metrics existed show those values as '{OLDER}' (never 0); "
        "a group that lacks some cells' values sums the others and says how many lack them.",
        "Rows per sweep file overlap where a cell serves several sweeps; the total counts each "
        "cell once.",
        ("GPU types: " + ", ".join(types)) if types else "No run used a GPU.",
        "USD: GPU-hours x cost.gpu_hour_usd of the job's GPU type, when the job ran." if priced
        else "No job's GPU type was priced (cost.gpu_hour_usd): no USD column.",
    ]
    return table


def amount(column: str, value: float) -> str:
    """A total as `hacrl status` says it: `0.45 h` (seconds: `27 s` under a tenth of an hour),
    `1.2M` tokens, `0.81 GB`, `12.30 USD`."""
    if column in SECONDS:
        return f"{value / HOUR:.2f} h" if value >= HOUR / 10 else f"{value:.0f} s"
    if column.startswith("tokens"):
        for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if value >= limit:
                return f"{value / limit:.1f}{suffix}"
        return f"{value:.0f}"
    return f"{value:.2f} GB" if column == PEAK else f"{value:.2f} USD"


def summary_line(costs: list[CellCost], others: dict[str, int]) -> str:
    """`hacrl status`'s line: the done cells' cost so far, and the cells not counted yet."""
    parts = []
    names = {"wall_s": "cells' wall {} (summed)", "cpu_s": "CPU {}", "gpu_s": "GPU {}",
             PEAK: "peak RSS {}", "tokens_sampled": "{} tokens sampled", "tokens_trained": "{} trained",
             "usd": "{}"}
    for column, name in names.items():
        value = total(costs, column)
        if value.mean is None:
            if column == "usd":
                continue  # nothing priced: no money to speak of
            text = name.format("—")
        else:
            text = name.format(amount(column, value.mean))
        if value.reason and costs:
            text += f" ({value.reason})"
        parts.append(text)
    waiting = ", ".join(f"{n} {s}" for s, n in others.items() if n)
    return (f"cost so far ({n_cells(len(costs))} done): " + ", ".join(parts)
            + (f"; not counted yet: {waiting}" if waiting else ""))


def status_line(store: Store, cells: list[CellRecord], statuses: dict[str, str]) -> str:
    """The cost line of `hacrl status`: cells whose status is done (or skipped) counted, the
    running and pending ones named."""
    done = [c for c in cells if statuses.get(c.id) in ("done", "skipped")]
    others: dict[str, int] = {}
    for c in cells:
        status = statuses.get(c.id, "pending")
        if status in ("running", "pending"):
            others[status] = others.get(status, 0) + 1
    return summary_line(sweep_costs(store, done), others)


__all__ = ["COLUMNS", "CellCost", "cell_cost", "cost_table", "status_line", "summary_line",
           "sweep_costs", "total"]
