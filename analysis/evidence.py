"""The per-problem outcomes behind a table cell, as the statistics module reads them.

A table cell (method, pair, agent, and e.g. alpha) stands for one or more runs, one per seed.
`Evidence.cell` finds them (through the sweep's cells, as every table does), reads their
evaluation outcomes (`analysis.outcomes`) and lays them out as `analysis.stats` wants them:
benchmark -> scores `[n_seeds, n_problems]`, seeds in increasing order, problems in problem-id
order. `Evidence.paired` keeps the seeds two cells share, so a comparison is paired by seed and
by problem. Cells whose runs logged no outcomes (runs older than the outcomes artifact, or the
paper's reference rows) have no samples: they say why, and no statistic is made up for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.cell_values import find, run_value
from analysis.context import Context, Pair
from analysis.outcomes import OutcomesError, aligned_problem_means, read_outcomes
from analysis.stats import AVG, Difference, Estimate, cell_estimates, components, paired_difference
from hacrl.schema import metric_names as M


@dataclass
class CellSamples:
    """The runs of one table cell and their per-problem scores (None: no samples, see `reason`)."""

    runs: dict[int, str] = field(default_factory=dict)        # seed -> agent run id
    scores: dict[str, np.ndarray] | None = None               # benchmark -> [seeds, problems]
    reason: str = ""

    @property
    def seeds(self) -> list[int]:
        return sorted(self.runs)

    def for_seeds(self, seeds: list[int]) -> dict[str, np.ndarray]:
        """The scores of these seeds only (rows in the order given)."""
        assert self.scores is not None
        rows = [self.seeds.index(s) for s in seeds]
        return {b: m[rows] for b, m in self.scores.items()}


@dataclass(frozen=True)
class Precision:
    """Standard errors of AVG across a report's cells (fractions, not points)."""

    run_se_median: float     # one run's AVG over its problems
    run_se_max: float
    cell_se_median: float    # a cell's AVG over problems and seeds
    cell_se_max: float
    problems: str            # problems per evaluation, e.g. "7300"
    seeds_text: str          # e.g. "3 seeds" or "1 seed or 3 seeds"


class Evidence:
    """Outcomes of a report's runs, read once per (cell, protocol) and kept."""

    def __init__(self, ctx: Context, n_boot: int = 2000) -> None:
        self.ctx, self.n_boot = ctx, n_boot
        self._cells: dict[tuple[Any, ...], CellSamples] = {}

    def cell(self, method: str, p: Pair, agent: str, sweep: str | None, protocol: str,
             **params: Any) -> CellSamples:
        key = (method, p.name, agent, sweep, protocol, tuple(sorted(params.items())))
        if key not in self._cells:
            self._cells[key] = self._load(method, p, agent, sweep, protocol, **params)
        return self._cells[key]

    def _load(self, method: str, p: Pair, agent: str, sweep: str | None, protocol: str,
              **params: Any) -> CellSamples:
        team = self.ctx.team(method, p, agent)
        metric = M.eval_avg(protocol)
        runs: dict[int, str] = {}
        for cell in find(self.ctx.cells, method, team, sweep, **params):
            value = run_value(self.ctx.store, cell, agent, metric)
            if value.values:  # the run that gives the table its number
                runs[int(cell.seed)] = value.run_ids[0]
        if not runs:
            return CellSamples(reason="not run")
        seeds = sorted(runs)
        got = read_outcomes(self.ctx.store, [runs[s] for s in seeds], protocol)
        if got.missing:
            return CellSamples(runs, reason=f"no samples ({len(got.missing)} of {len(runs)} "
                               "runs logged no per-problem outcomes)")
        # the benchmarks every seed's run has: a sweep that reads one benchmark evaluates its
        # own seeds on that one alone, next to seeds shared with a table that reads them all
        per_run = got.table.groupby("run_id")["benchmark"].unique()
        common = sorted(set.intersection(*(set(per_run.get(runs[s], [])) for s in seeds)))
        try:
            scores = aligned_problem_means(got.table, [runs[s] for s in seeds], common)
        except OutcomesError as err:  # e.g. seeds evaluated on different benchmark versions
            return CellSamples(runs, reason=f"no samples ({err})")
        return CellSamples(runs, scores)

    def precision(self) -> Precision | None:
        """The standard errors of AVG over the cells read so far (None: none had samples)."""
        cells = [c for c in self._cells.values() if c.scores is not None]
        if not cells:
            return None
        # AVG is over every benchmark: cells evaluated on fewer (MATH-500 alone) are left out
        full = max(len(c.scores or {}) for c in cells)
        cells = [c for c in cells if len(c.scores or {}) == full]
        runs, means = [], []
        for cell in cells:
            assert cell.scores is not None
            means.append(components(cell.scores)[AVG].se)
            for row in range(len(cell.runs)):  # one seed alone: all of its variance is problems
                runs.append(components({b: m[[row]] for b, m in cell.scores.items()})[AVG].se)
        problems = sorted({sum(m.shape[1] for m in c.scores.values()) for c in cells
                           if c.scores is not None})
        seeds = sorted({len(c.runs) for c in cells})
        return Precision(float(np.median(runs)), max(runs), float(np.median(means)), max(means),
                         "/".join(str(p) for p in problems),
                         " or ".join(f"{s} seed{'s' if s > 1 else ''}" for s in seeds))

    def estimates(self, samples: CellSamples) -> dict[str, Estimate] | None:
        """Mean and 95% interval per benchmark, AVG and IQM (None without samples)."""
        if samples.scores is None:
            return None
        return cell_estimates(samples.scores, n_boot=self.n_boot)

    def paired(self, a: CellSamples, b: CellSamples) -> dict[str, Difference] | None:
        """A - B over the seeds both have and the same problems (None: no samples, or no seed
        in common)."""
        if a.scores is None or b.scores is None:
            return None
        common = [s for s in a.seeds if s in b.runs]
        if not common:
            return None
        left, right = a.for_seeds(common), b.for_seeds(common)
        if set(left) != set(right) or any(left[k].shape != right[k].shape for k in left):
            return None  # evaluated on other benchmarks or problem sets: not comparable
        return paired_difference(left, right, n_boot=self.n_boot)


def evidence_of(ctx: Context) -> Evidence:
    """The context's `Evidence`, made on first use and kept with it (tables, claims and
    figures of one report read each cell's outcomes once)."""
    if ctx.evidence is None:
        ctx.evidence = Evidence(ctx)
    assert isinstance(ctx.evidence, Evidence)
    return ctx.evidence
