"""Which run of a side of `hacrl compare` stands for a cell's agent (`RunPicker`).

The latest FINISHED run of the cell's config hash with the protocol's AVG, as the report picks
it (`analysis.cell_values`). With `@COMMIT` the side's store holds only the runs made at that
commit (`analysis.compare_sides.at_commit`); where the change made a cell's config hash another,
the run is found by identity among the runs the sweep made there, and said in a note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from analysis.cell_values import run_value
from analysis.compare_pairing import IDENTITY, cell_what, setting, settings_of
from analysis.compare_sides import Side
from analysis.store import Store
from hacrl.schema import metric_names as M
from hacrl.schema import tags as T
from hacrl.schema.sweep_manifest import CellRecord


@dataclass
class PickedRuns:
    """One side's runs of one group's agent: seed -> run id, and why a seed has none."""

    runs: dict[int, str] = field(default_factory=dict)
    why: dict[int, str] = field(default_factory=dict)


class RunPicker:
    """Which run of a side stands for a cell's agent: the latest FINISHED run of the cell's
    config hash with the protocol's AVG (as the report picks it). At a commit, a cell whose
    hash has no such run there (the change made its config hash another) is found by identity
    among the runs the sweep made at that commit: the same method, seed, agent and team, and
    the cell's grid settings among the run's params; several such cells are ambiguous."""

    def __init__(self, side: Side, store: Store, protocol: str) -> None:
        self.side, self.store, self.protocol = side, store, protocol
        self.metric = M.eval_avg(protocol)
        self.notes: list[str] = []
        self._params: dict[str, dict[str, str]] = {}

    def pick(self, cells: dict[int, CellRecord], agent: str) -> PickedRuns:
        out = PickedRuns()
        for seed, cell in cells.items():
            if cell.protocols and self.protocol not in cell.protocols:
                out.why[seed] = (f"not evaluated under protocol {self.protocol} (its: "
                                 f"{', '.join(cell.protocols)})")
                continue
            value = run_value(self.store, cell, agent, self.metric)
            if value.values:
                out.runs[seed] = value.run_ids[0]
                continue
            out.why[seed] = value.reason or "not run"
            if self.side.spec.commit and cell.trains:
                found, why = self._by_identity(cell, agent)
                if found:
                    out.runs[seed] = found
                elif why:
                    out.why[seed] = why
        return out

    def _by_identity(self, cell: CellRecord, agent: str) -> tuple[str | None, str]:
        runs, sweep = self.store.runs, self.side.manifest.sweep or self.side.spec.name
        if self.metric not in runs:
            return None, ""
        made_by = runs[T.SWEEPS].fillna("").astype(str).str.split(",").map(
            lambda s: sweep in s).astype(bool)
        found = runs[made_by & (runs[T.KIND] == T.AGENT) & (runs[T.MODEL] == agent)
                     & (runs[T.METHOD] == cell.method) & (runs[T.SEED] == str(cell.seed))
                     & (runs["status"] == "FINISHED") & runs[self.metric].notna()]
        if found.empty:
            return None, ""
        teams = runs[runs[T.KIND] == T.AGENT].groupby(T.PARENT)[T.MODEL].agg(frozenset)
        found = found[found[T.PARENT].map(
            lambda job: teams.get(job) == frozenset(cell.agents)).astype(bool)]
        grid = settings_of(o for o in cell.overrides
                           if setting(o) not in ("pair", "method", *IDENTITY))
        hashes = [h for h, rows in found.groupby(T.CONFIG_HASH, sort=False)
                  if self._has(str(rows.iloc[0]["run_id"]), grid)]
        what = f"{self.side.label or self.side.spec.label}: {cell_what(cell)}, {agent}"
        if len(hashes) > 1:
            return None, (f"{len(hashes)} cells of the sweep at commit {self.side.spec.commit} "
                          f"match by identity (config hashes {', '.join(sorted(map(str, hashes)))})")
        if not hashes:
            return None, ""
        run = str(found[found[T.CONFIG_HASH] == hashes[0]].iloc[0]["run_id"])
        self.notes.append(f"{what}: run {run} at commit {self.side.spec.commit} found by "
                          f"identity (its config hash {hashes[0]}, the manifest's {cell.id})")
        return run, ""

    def _has(self, run_id: str, grid: dict[str, str]) -> bool:
        """The run's params hold the cell's grid settings (a config group choice, which no
        param names, is not checked)."""
        if run_id not in self._params:
            self._params[run_id] = dict(self.store.client.get_run(run_id).data.params)
        params = self._params[run_id]
        return all(_same_value(params[k], v) for k, v in grid.items() if k in params)


def _same_value(a: str, b: str) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    except ValueError:
        return a.strip("'\"") == b.strip("'\"")
