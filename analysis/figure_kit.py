"""What every report figure is drawn with, so that each shows how sure it is and none exaggerates.

* a curve over training steps (`seed_curves`, `draw_seeds`): every seed's run of the cell, drawn
  as the mean over seeds with a min-max band over seeds (one run: the line alone);
* an evaluation score (`score`, `draw_scores`): the estimate with its 95% interval from the
  per-problem outcomes (`analysis.evidence`, the bootstrap of `analysis.stats`) as an error bar;
  a value without samples (an old run, the paper's published number) is a hollow marker without
  a bar, and the legend says "no samples";
* axes (`from_zero`): accuracies, rewards, lengths and ratios start at 0, one top for all panels
  of a figure, the range written in the axis label.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from analysis.cell_values import curve_run, find  # noqa: E402
from analysis.context import Context, Pair  # noqa: E402
from analysis.evidence import evidence_of  # noqa: E402
from analysis.stats import AVG  # noqa: E402
from hacrl.schema import metric_names as M  # noqa: E402

COLORS = {"hacpo": "#d62728", "gspo": "#1f77b4", "gspo_x2": "#2ca02c", "naive": "#9467bd",
          "grpo": "#8c564b", "hacpo_no_stepwise": "#ff7f0e", "hacpo_no_clip": "#7f7f7f"}
SEED_BAND = "line: mean over seeds, band: min–max over seeds"
INTERVAL = "bars: 95% interval over problems × seeds"
NO_SAMPLES = "no samples"


def seed_curves(ctx: Context, method: str, p: Pair, agent: str, key: str, sweep: str | None,
                **params: Any) -> dict[int, list[tuple[int, float]]]:
    """seed -> the curve `key` of `agent`'s run in each of the cell's seeds (seeds whose run has
    not logged it are left out)."""
    out = {}
    for cell in find(ctx.cells, method, ctx.team(method, p, agent), sweep, **params):
        run_id = curve_run(ctx.store, cell, agent)
        points = ctx.store.history(run_id, key) if run_id is not None else []
        if points:
            out[int(cell.seed)] = points
    return out


def draw_seeds(ax: Axes, curves: dict[int, list[tuple[int, float]]], label: str | None,
               color: Any = None, band: bool = True, **style: Any) -> bool:
    """The mean over seeds at the steps every seed logged, with a min-max band when there are
    several seeds (one seed: its line alone; `band=False`: the mean alone, e.g. for a curve
    drawn as context). `label` None: not in the legend. False when there is nothing to draw."""
    if not curves:
        return False
    by_seed = [dict(points) for points in curves.values()]
    steps = sorted(set.intersection(*(set(c) for c in by_seed)))
    if not steps:
        return False
    values = np.array([[c[s] for s in steps] for c in by_seed])  # [seeds, steps]
    n = len(by_seed)
    style = {"lw": 1.4, **style}
    name = f"{label} ({n} seeds)" if n > 1 else f"{label} (1 run)"
    (line,) = ax.plot(steps, values.mean(axis=0), color=color, **style,
                      label="_nolegend_" if label is None else name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    if n > 1 and band:
        ax.fill_between(steps, values.min(axis=0), values.max(axis=0), color=line.get_color(),
                        alpha=0.15, lw=0)
    return True


@dataclass(frozen=True)
class Score:
    """An evaluation score: the estimate, and its 95% interval when the runs logged outcomes."""

    value: float | None
    lo: float | None = None
    hi: float | None = None
    n_seeds: int = 0
    why: str = ""  # without an interval: why (no samples, not run, ...)

    @property
    def has_interval(self) -> bool:
        return self.lo is not None and self.hi is not None


def benchmark_name(ctx: Context, benchmark: str) -> str:
    """A benchmark as this scale logs it: math500 -> tiny_math500 at tiny scale."""
    return benchmark if ctx.scale == "paper" else f"tiny_{benchmark}"


def score(ctx: Context, method: str, p: Pair, agent: str, sweep: str, protocol: str,
          benchmark: str | None = None, params: Mapping[str, Any] | None = None) -> Score:
    """`agent`'s accuracy on `benchmark` (None: AVG) under `method` with these settings (e.g.
    alpha), over the cell's seeds: the bootstrap estimate and interval, or the logged value
    alone where no outcomes were logged."""
    params = params or {}
    evidence = evidence_of(ctx)
    samples = evidence.cell(method, p, agent, sweep, protocol, **params)
    name = AVG if benchmark is None else benchmark_name(ctx, benchmark)
    found = (evidence.estimates(samples) or {}).get(name)
    if found is not None and math.isfinite(found.lo) and math.isfinite(found.hi):
        return Score(found.estimate, found.lo, found.hi, found.n_seeds)
    metric = M.eval_avg(protocol) if benchmark is None else M.eval_metric(protocol, name)
    logged = ctx.value(method, p, agent, metric, sweep, **params)
    why = NO_SAMPLES if logged.values else (logged.reason or "not run")
    return Score(logged.mean, n_seeds=logged.n, why=why)


def draw_scores(ax: Axes, xs: Sequence[float], scores: Sequence[Score], label: str,
                color: Any = None, **style: Any) -> int:
    """A line through the scores that have a value; error bars (the 95% interval) on those with
    samples, hollow markers without a bar on those without. Returns the points drawn."""
    points = [(x, s, s.value) for x, s in zip(xs, scores, strict=True) if s.value is not None]
    if not points:
        return 0
    (line,) = ax.plot([x for x, _, _ in points], [v for _, _, v in points], color=color,
                      **{"lw": 1.2, **style})
    color = line.get_color()
    sure = [(x, s) for x, s, _ in points if s.has_interval]
    if sure:
        ys = np.array([s.value for _, s in sure], dtype=float)
        lo = np.array([s.lo for _, s in sure], dtype=float)
        hi = np.array([s.hi for _, s in sure], dtype=float)
        seeds = sorted({s.n_seeds for _, s in sure})
        runs = f"{'/'.join(map(str, seeds))} seed{'s' if seeds != [1] else ''}"
        ax.errorbar([x for x, _ in sure], ys, yerr=[ys - lo, hi - ys], fmt="o", ms=4,
                    color=color, capsize=3, lw=1.2, label=f"{label} ({runs}, 95% interval)")
    bare = [(x, v) for x, s, v in points if not s.has_interval]
    if bare:
        ax.plot([x for x, _ in bare], [v for _, v in bare], ls="none", marker="o", ms=5,
                mfc="white", color=color, label=f"{label} ({NO_SAMPLES}: no interval)")
    return len(points)


def from_zero(axes: Sequence[Axes], label: str, ceiling: float | None = 1.0,
              reference: float | None = None) -> None:
    """Every axis from 0 (lower only if some value is below 0) to one top shared by the panels
    of a figure (the data's highest point, bands and bars included, rounded up; at most
    `ceiling`, e.g. 1 for an accuracy), the range in the label; `reference` draws a dotted line
    there (e.g. omega = 1)."""
    drawn = [ax.dataLim for ax in axes if ax.has_data() and np.isfinite(ax.dataLim.y1)]
    top = nice_top(max([*(d.y1 for d in drawn), reference or 0.0]))
    if ceiling is not None:
        top = min(top, ceiling)
    low = min([0.0, *(d.y0 for d in drawn)])  # below 0 only if something is (never hidden)
    low = -nice_top(-low) if low < 0 else 0.0
    for ax in axes:
        ax.set_ylim(low, top)
        ax.set_ylabel(f"{label}\n(axis from {low:g} to {top:g})", fontsize=8)
        if reference is not None:
            ax.axhline(reference, color="#555555", lw=0.8, ls=":")


def nice_top(high: float) -> float:
    """A round number just above `high`: 0.58 -> 0.6, 0.93 -> 0.95, 31 -> 35 (1 for nothing)."""
    if not high > 0 or not math.isfinite(high):
        return 1.0
    step = 10 ** math.floor(math.log10(high)) / 2
    return round(math.ceil(high * 1.02 / step) * step, 10)


def legend(ax: Axes, **style: Any) -> None:
    """The axes' legend, when something on it has a label."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**style)


def panels(n: int, title: str) -> tuple[Figure, list[Axes]]:
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.4 * rows), squeeze=False)
    fig.suptitle(title, fontsize=10)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def finish(fig: Figure, drawn: int) -> Figure | None:
    """The laid-out figure, or None (closed) when nothing of it has run yet."""
    fig.tight_layout()
    if not drawn:
        plt.close(fig)
        return None
    return fig
