"""A sweep's cells and the values their runs logged (or why there is none).

A report places runs by the sweep that defines them: the sweep's cells (records of the sweep
manifest, `hacrl.schema.sweep_manifest.CellRecord`: the manifest `hacrl sweep` wrote, or the
command's fresh expansion of a sweep that has none) carry their config hash, method, agents,
seed and resolved settings; a cell's runs are the store's runs tagged with that hash (base
models: the evaluation run of the model's path). Nothing is matched by run name or by guess.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis.store import Store
from hacrl.schema import tags as T
from hacrl.schema.sweep_manifest import CellRecord

REASONS = {"RUNNING": "running", "FAILED": "failed", "KILLED": "killed",
           "SCHEDULED": "running", "FINISHED": "finished without this metric"}


@dataclass
class Value:
    """What the runs of one table cell logged: one value per run (e.g. per seed)."""

    values: list[float] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    reason: str = ""  # why a value is missing: not run, running, failed, killed, ...

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        """Sample standard deviation (ddof = 1, as the paper), with two or more values."""
        return statistics.stdev(self.values) if len(self.values) > 1 else None

    @staticmethod
    def combine(parts: list[Value]) -> Value:
        """Several cells' values as one (seeds); the reasons of the missing ones are kept."""
        if len(parts) == 1:
            return parts[0]
        out = Value([v for p in parts for v in p.values], [r for p in parts for r in p.run_ids])
        missing = [p.reason or "not run" for p in parts if not p.values]
        if missing:
            counts = {r: missing.count(r) for r in dict.fromkeys(missing)}
            out.reason = ", ".join(f"{n} of {len(parts)} {r}" for r, n in counts.items())
        return out


def cell_runs(store: Store, cell: CellRecord, agent: str | None) -> pd.DataFrame:
    """The runs of a cell, newest first: agent `agent`'s runs, or the job runs (agent None);
    a base model's evaluation runs for method=base."""
    runs = store.runs
    if not cell.trains:
        path = cell.model_paths.get(agent or "", "")
        draw = runs[T.ZOO_SEED].fillna("0").replace("", "0")  # untagged: the default draw
        return runs[(runs[T.KIND] == T.EVAL) & (runs[T.MODEL_PATH] == path)
                    & (runs[T.SCALE] == cell.scale) & (draw == str(cell.zoo_seed))]
    if agent is None:
        return runs[(runs[T.CONFIG_HASH] == cell.id) & (runs[T.KIND] == T.JOB)]
    return runs[(runs[T.CONFIG_HASH] == cell.id) & (runs[T.KIND] == T.AGENT)
                & (runs[T.MODEL] == agent)]


def curve_run(store: Store, cell: CellRecord, agent: str) -> str | None:
    """The run whose curves stand for the cell: the latest finished one, else the latest (a
    running job's curves are worth seeing)."""
    runs = cell_runs(store, cell, agent)
    if runs.empty:
        return None
    done = runs[runs["status"] == "FINISHED"]
    return str((done if not done.empty else runs).iloc[0]["run_id"])


def run_value(store: Store, cell: CellRecord, agent: str | None, metric: str) -> Value:
    """`metric` of the cell's run: of agent `agent`'s run, or of the job run (agent None)."""
    runs = cell_runs(store, cell, agent)
    if runs.empty:
        return Value(reason="not run")
    if metric in runs:
        done = runs[(runs["status"] == "FINISHED") & runs[metric].notna()]
        if not done.empty:  # the latest finished run (rows are newest first)
            value = float(done.iloc[0][metric])
            if not math.isnan(value):
                return Value([value], [str(done.iloc[0]["run_id"])])
    latest = runs.iloc[0]
    reason = REASONS.get(str(latest["status"]), str(latest["status"]).lower())
    return Value(run_ids=[str(latest["run_id"])], reason=reason)


def find(cells: list[CellRecord], method: str, agents: list[str], sweep: str | None = None,
         **params: Any) -> list[CellRecord]:
    """Cells of `method` trained on exactly `agents`, in `sweep` and with these settings."""
    out = []
    for cell in cells:
        if cell.method != method or list(cell.agents) != list(agents):
            continue
        if sweep is not None and sweep not in cell.sweeps:
            continue
        if all(_same(cell.seed if k == "seed" else cell.params.get(k), v)
               for k, v in params.items()):
            out.append(cell)
    return out


def _same(a: Any, b: Any) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    except (TypeError, ValueError):
        return str(a) == str(b)
