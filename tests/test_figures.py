"""The report's figures show their uncertainty and start their axes at 0: a real MLflow store
whose runs log curves, scores and per-problem outcomes (some runs without outcomes, as old runs
are), the figures built from it, and their matplotlib objects checked against the numbers
(error bars = the bootstrap interval of `analysis.stats`, bands = the seeds' min and max)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pyarrow as pa
import pytest
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.container import ErrorbarContainer

from analysis.context import Context, Pair
from analysis.figure_kit import nice_top
from analysis.figures import alpha_plot, figure2, schedule_heatmaps
from analysis.figures_dynamics import hacpo_dynamics, training_curves
from analysis.stats import AVG, cell_estimates
from analysis.store import open_store
from hacrl.config import compose
from hacrl.evaluation.outcome_table import SCHEMA, write_outcomes
from hacrl.schema import eval_artifacts as A
from hacrl.schema.sweep_manifest import CellRecord
from hacrl.sweep.grid import pair_record, recorded_facts
from hacrl.tracking import Tracker

SIZE = Pair.of("size", pair_record("size", compose))
SMALL, BIG = SIZE.agents
SEEDS = (0, 1, 42)
BENCHMARKS = ("tiny_math500", "tiny_gsm8k")
PROBLEMS = 40
VAL = "val/tiny_math500/acc"
GRIDS: dict[str, list[dict[str, Any]]] = {
    "table1": [{"pair": ["size"], "method": ["hacpo", "gspo", "gspo_x2"], "protocol": ["main"]}],
    "alpha": [{"pair": ["size"], "method": "hacpo", "algo.alpha": [0, 1],
               "protocol": ["ablation"]}],
    "schedules": [{"pair": "size", "method": "hacpo", "algo.alpha": [1],
                   "algo.cross_clip_lower": [0.8, 0.9], "algo.delta_step": [0.01],
                   "protocol": ["ablation"]}],
}


def _cell(cid: str, method: str, agents: tuple[str, ...] | list[str], sweep: str, seed: int = 0,
          /, **params: float) -> CellRecord:
    """A cell of `method`; `params` (names with dots, so passed as `**{...}`) over the default
    alpha. The named arguments are positional-only: no key in `params` can land on them."""
    return CellRecord(cid, [], method, list(agents), seed, sweeps=[sweep],
                      protocols=["main", "ablation"], scale="tiny",
                      params={"algo.alpha": 1.0, **params})


class World:
    """Runs written into a real sqlite store through hacrl's Tracker, outcomes as the evaluation
    writes them (`write_outcomes`: checked against the logged acc)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tracker = Tracker(f"sqlite:///{root / 'mlflow.db'}", "hacrl")
        self.cells: list[CellRecord] = []
        self.scores: dict[tuple[str, str], np.ndarray] = {}  # (cell, agent) -> [benchmarks, P]
        self.curves: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
        self.rng = np.random.default_rng(7)

    def run(self, cell: CellRecord, agent: str, level: float, protocol: str,
            outcomes: bool = True, curves: dict[str, list[float]] | None = None) -> None:
        run_id = self.tracker.start_run(f"{cell.method}:{agent}", {
            "hacrl.kind": "agent", "config_hash": cell.id, "method": cell.method,
            "model": agent, "scale": "tiny", "seed": str(cell.seed)})
        for key, values in (curves or {}).items():
            self.curves[(cell.id, agent, key)] = list(enumerate(values))
            for step, value in enumerate(values):
                self.tracker.log_metrics(run_id, {key: value}, step)
        grades = (self.rng.random((len(BENCHMARKS), PROBLEMS)) < level).astype(np.int8)
        self.scores[(cell.id, agent)] = grades.astype(float)
        metrics = {b: {"acc": sum(float(g) for g in row) / PROBLEMS}
                   for b, row in zip(BENCHMARKS, grades, strict=True)}
        logged = {f"eval/{protocol}/{b}/acc": m["acc"] for b, m in metrics.items()}
        logged[f"eval/{protocol}/avg/acc"] = float(np.mean([m["acc"] for m in metrics.values()]))
        self.tracker.log_metrics(run_id, logged, 5)
        if outcomes:
            table = pa.table({
                "benchmark": [b for b in BENCHMARKS for _ in range(PROBLEMS)],
                "problem": [f"p{i:03d}" for _ in BENCHMARKS for i in range(PROBLEMS)],
                "sample": [0] * (len(BENCHMARKS) * PROBLEMS),
                "answer": [""] * (len(BENCHMARKS) * PROBLEMS),
                "correct": grades.ravel().tolist()}, schema=SCHEMA)
            path = write_outcomes(table, metrics, dict.fromkeys(BENCHMARKS, 1),
                                  self.root / run_id / A.OUTCOMES_FILE)
            self.tracker.log_artifact(run_id, path, A.folder(protocol))
        self.tracker.finish(run_id)

    def cell_scores(self, cells: list[CellRecord], agent: str) -> dict[str, np.ndarray]:
        """benchmark -> [seeds, problems] as the statistics want them: seeds and benchmarks in
        order, as `analysis.evidence` lays them out (the bootstrap draws in that order)."""
        rows = [self.scores[(c.id, agent)] for c in sorted(cells, key=lambda c: c.seed)]
        return {b: np.vstack([r[BENCHMARKS.index(b)] for r in rows]) for b in sorted(BENCHMARKS)}


def _steps(base: float, slope: float) -> list[float]:
    return [round(base + slope * s, 4) for s in range(6)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Context, World]:
    w = World(tmp_path_factory.mktemp("figures"))
    for seed in SEEDS:  # HACPO: three seeds, curves and outcomes
        c = _cell(f"hacpo{seed}", "hacpo", SIZE.agents, "table1", seed)
        w.cells.append(c)
        for agent, level in ((SMALL, 0.3), (BIG, 0.6)):
            curves = {VAL: _steps(level - 0.05 + 0.01 * (seed % 7), 0.01),
                      "capability/P": _steps(level - 0.1 + 0.002 * seed, 0.02),
                      "reward/mean": _steps(level + 0.001 * seed, 0.005)}
            w.run(c, agent, level, "main", curves=curves)
    one = _cell("gspo0", "gspo", [SMALL], "table1")  # GSPO: one run
    w.cells.append(one)
    w.run(one, SMALL, 0.25, "main", curves={VAL: _steps(0.2, 0.004)})
    for alpha, outcomes in ((0.0, True), (1.0, False)):  # alpha 1: an old run, no outcomes
        c = _cell(f"alpha{alpha:g}", "hacpo", SIZE.agents, "alpha", **{"algo.alpha": alpha})
        w.cells.append(c)
        for agent in SIZE.agents:
            w.run(c, agent, 0.4 + 0.1 * alpha, "ablation", outcomes=outcomes)
    for lower, outcomes in ((0.8, True), (0.9, False)):
        c = _cell(f"sched{lower:g}", "hacpo", SIZE.agents, "schedules", **{
            "algo.alpha": 1.0, "algo.cross_clip_lower": lower, "algo.delta_step": 0.01})
        w.cells.append(c)
        for agent in SIZE.agents:
            w.run(c, agent, 0.5, "ablation", outcomes=outcomes)
    ctx = Context(open_store(w.tracker.uri), w.cells, "tiny", GRIDS, **recorded_facts(GRIDS, compose))
    return ctx, w


def _panel(fig: plt.Figure, agent: str) -> Axes:
    (ax,) = [a for a in fig.axes if a.get_title().startswith(agent)]
    return ax


def _bars(ax: Axes) -> dict[float, tuple[float, float]]:
    """x -> (lo, hi) of every error bar drawn on the axes."""
    out = {}
    for container in ax.containers:
        if isinstance(container, ErrorbarContainer):
            (bars,) = container.lines[2]
            for (x, lo), (_, hi) in bars.get_segments():
                out[float(x)] = (float(lo), float(hi))
    return out


def _band(ax: Axes) -> dict[float, tuple[float, float]]:
    """x -> (lowest, highest) y of the one band drawn on the axes."""
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    out: dict[float, tuple[float, float]] = {}
    for x, y in np.asarray(band.get_paths()[0].vertices):  # typed as any array-like
        lo, hi = out.get(float(x), (np.inf, -np.inf))
        out[float(x)] = (min(lo, float(y)), max(hi, float(y)))
    return out


def test_scores_with_samples_get_their_interval_and_the_others_none(world):
    ctx, w = world
    fig = alpha_plot(ctx)
    assert fig is not None
    for agent in SIZE.agents:
        ax = _panel(fig, agent)
        cell = [c for c in w.cells if c.id == "alpha0"]
        want = cell_estimates(w.cell_scores(cell, agent))["tiny_math500"]
        bars = _bars(ax)
        assert list(bars) == [0.0]  # alpha 1 logged no outcomes: no bar, not a zero-width one
        assert bars[0.0] == pytest.approx((want.lo, want.hi), abs=1e-12)
        assert want.lo < want.estimate < want.hi
        hollow = [line for line in ax.get_lines() if line.get_markerfacecolor() == "white"
                  or line.get_markerfacecolor() == (1.0, 1.0, 1.0, 1.0)]
        xs = sorted(float(x) for line in hollow for x in line.get_xdata())
        assert xs == [0.0, 1.0, 1.0, 2.0, 3.0]  # ours at alpha 1, the paper's four
        acc = w.scores[("alpha1", agent)][0].mean()
        assert any(float(x) == 1.0 and float(y) == pytest.approx(acc)
                   for line in hollow for x, y in zip(*line.get_data(), strict=True))
        labels = " | ".join(t.get_text() for t in ax.get_legend().get_texts())
        assert "ours (no samples" in labels and "paper (no samples" in labels
        assert "ours (1 seed, 95% interval)" in labels
        assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= max(want.hi, 0.668)
        assert "from 0 to" in ax.get_ylabel()
    plt.close(fig)


def test_heatmap_cells_print_the_interval_or_say_no_samples(world):
    ctx, w = world
    fig = schedule_heatmaps(ctx)
    assert fig is not None
    ax = _panel(fig, SMALL)
    cell = [c for c in w.cells if c.id == "sched0.8"]
    want = cell_estimates(w.cell_scores(cell, SMALL))[AVG]
    texts = [t.get_text() for t in ax.texts]
    assert texts[0] == f"{want.estimate:.3f}\n[{want.lo:.3f}, {want.hi:.3f}]"
    assert texts[1].endswith("\nno samples")
    (image,) = ax.get_images()
    assert image.norm.vmin == 0  # colours from 0, not from the lowest cell
    plt.close(fig)


def test_curves_over_seeds_are_the_mean_with_a_band_spanning_the_seeds(world):
    ctx, w = world
    fig = figure2(ctx)
    assert fig is not None
    ax = _panel(fig, SMALL)
    seeds = np.array([[v for _, v in w.curves[(f"hacpo{s}", SMALL, VAL)]] for s in SEEDS])
    (hacpo,) = [line for line in ax.get_lines() if line.get_label() == "HACPO (3 seeds)"]
    assert np.allclose(hacpo.get_ydata(), seeds.mean(axis=0))
    band = _band(ax)  # only HACPO has seeds: GSPO's one run is its line alone
    assert sorted(band) == list(range(6))
    for step in range(6):
        assert band[step] == pytest.approx((seeds[:, step].min(), seeds[:, step].max()))
    assert seeds.min(axis=0).tolist() != seeds.max(axis=0).tolist()  # a band that has width
    assert any(line.get_label() == "GSPO (1 run)" for line in ax.get_lines())
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= seeds.max()
    assert "mean over seeds" in fig.texts[0].get_text()  # the suptitle says what the band is
    plt.close(fig)


def test_dynamics_and_training_curves_band_over_seeds_from_zero(world):
    ctx, w = world
    fig = hacpo_dynamics(ctx)
    assert fig is not None
    ax = fig.axes[0]  # P_k: both agents, three seeds each
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2
    seeds = np.array([[v for _, v in w.curves[(f"hacpo{s}", BIG, "capability/P")]]
                      for s in SEEDS])
    ys = np.concatenate([b.get_paths()[0].vertices[:, 1] for b in bands])
    assert ys.max() == pytest.approx(seeds.max()) and ax.get_ylim() == (0, nice_top(ys.max()))
    plt.close(fig)
    fig = training_curves(ctx)
    assert fig is not None
    reward = [a for a in fig.axes if a.get_title() == f"{SMALL}: reward/mean"][0]
    assert reward.get_ylim()[0] == 0 and len(_band(reward)) == 6
    plt.close(fig)


def test_a_round_top_just_above_the_data():
    assert [nice_top(h) for h in (0.58, 0.93, 31.0, 0.0)] == [0.6, 0.95, 35.0, 1.0]


def test_alpha_table_cells_carry_the_same_intervals(world):
    from analysis.tables_accuracy import alpha_table

    ctx, w = world
    table = alpha_table(ctx)
    rows = {r: es for _, r, es in table.rows}
    for agent in SIZE.agents:
        zero, one = rows[agent][:2]  # alpha 0 (outcomes logged), alpha 1 (an old run)
        cell = [c for c in w.cells if c.id == "alpha0"]
        want = cell_estimates(w.cell_scores(cell, agent))["tiny_math500"]
        assert zero.interval == pytest.approx((want.lo, want.hi), abs=1e-12)
        assert one.interval is None and "no samples" in one.ours_text()
