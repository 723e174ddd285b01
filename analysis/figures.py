"""The paper's figures (2, 3, the alpha ablation) and the ones a reader wants besides (schedule
heatmaps, P_k and omega, s_hete, reward and response length over steps). Each builder returns a
matplotlib Figure (or None when nothing of it has run), registered under its key
(`analysis.table_registry`); `report` saves PNG and SVG."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from analysis.cell_values import curve_run, find  # noqa: E402
from analysis.context import Context, Pair  # noqa: E402
from analysis.reference import METHOD_LABELS, paper  # noqa: E402
from analysis.table_registry import register_figure  # noqa: E402

COLORS = {"hacpo": "#d62728", "gspo": "#1f77b4", "gspo_x2": "#2ca02c", "naive": "#9467bd",
          "grpo": "#8c564b", "hacpo_no_stepwise": "#ff7f0e", "hacpo_no_clip": "#7f7f7f"}


def _val_key(ctx: Context) -> str:
    return "val/math500/acc" if ctx.scale == "paper" else "val/tiny_math500/acc"


def _curve(ctx: Context, method: str, p: Pair, agent: str, key: str, sweep: str | None,
           **params: Any) -> list[tuple[int, float]]:
    from hacrl.algo.methods import METHODS

    team = list(p.agents) if METHODS[method].shares_rollouts else [agent]
    for cell in find(ctx.cells, method, team, sweep, **params):
        run_id = curve_run(ctx.store, cell, agent)
        if run_id is not None:
            return ctx.store.history(run_id, key)
    return []


def _panels(n: int, title: str) -> tuple[Figure, list[Any]]:
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.4 * rows), squeeze=False)
    fig.suptitle(title, fontsize=10)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _finish(fig: Figure, drawn: int) -> Figure | None:
    """The laid-out figure, or None (closed) when nothing of it has run yet."""
    fig.tight_layout()
    if not drawn:
        plt.close(fig)
        return None
    return fig


def _method_curves(ctx: Context, title: str, panels: list[tuple[Pair, str]],
                   methods: list[str], sweep: str, key: str, ylabel: str) -> Figure | None:
    fig, axes = _panels(len(panels), title)
    drawn = 0
    for ax, (p, agent) in zip(axes, panels, strict=True):
        for method in methods:
            points = _curve(ctx, method, p, agent, key, sweep)
            if points:
                drawn += 1
                ax.plot(*zip(*points, strict=True), marker="o", ms=2.5, lw=1.4,
                        color=COLORS.get(method), label=METHOD_LABELS.get(method, method))
        ax.set_title(f"{agent}  ({p.setting} pair)", fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _finish(fig, drawn)


@register_figure("figure2")
def figure2(ctx: Context) -> Figure | None:
    """MATH-500 accuracy vs step: HACPO, GSPO, GSPOx2, one panel per agent of each pair."""
    panels = [(p, a) for p in ctx.pairs_of("table1") for a in p.agents]
    return _method_curves(ctx, f"Figure 2: MATH-500 (validation) vs step — {ctx.scale} scale",
                          panels, ["hacpo", "gspo", "gspo_x2"], "table1", _val_key(ctx),
                          "MATH-500 accuracy")


@register_figure("figure3")
def figure3(ctx: Context) -> Figure | None:
    """Stepwise-clipping ablation on the figure3 pair, trained ~2.5x the usual steps."""
    panels = [(p, a) for p in ctx.pairs_of("figure3") for a in p.agents]
    methods = [str(m) for m in ctx.grid("figure3").get("method", [])]
    return _method_curves(ctx, f"Figure 3: stepwise clipping ablation — {ctx.scale} scale",
                          panels, methods, "figure3", _val_key(ctx), "MATH-500 accuracy")


@register_figure("alpha")
def alpha_plot(ctx: Context) -> Figure | None:
    """MATH-500 vs alpha per agent (ours solid, the paper's dashed on its own axis)."""
    alphas = [float(a) for a in ctx.grid("alpha").get("algo.alpha", [])]
    metric = ctx.benchmark_metric(ctx.protocol_of("alpha"), "math500")
    ref = paper("alpha_ablation")
    panels = [(p, a) for p in ctx.pairs_of("alpha") for a in p.agents]
    fig, axes = _panels(len(panels), f"Alpha ablation: MATH-500 of HACPO — {ctx.scale} scale")
    drawn = 0
    for ax, (p, agent) in zip(axes, panels, strict=True):
        ours = [(a, ctx.value("hacpo", p, agent, metric, "alpha", **{"algo.alpha": a}).mean)
                for a in alphas]
        ours = [(a, v) for a, v in ours if v is not None]
        if ours:
            drawn += 1
            ax.plot(*zip(*ours, strict=True), marker="o", color="#d62728", label="ours")
        pub = ref[(ref["pair"] == p.name) & (ref["model"] == agent)]
        if len(pub):
            twin = ax.twinx()
            twin.plot(pub["alpha"], pub["value"], ls="--", marker="s", color="#555555",
                      label="paper (right axis)")
            twin.legend(fontsize=7, loc="lower right")
        ax.set_title(agent, fontsize=9)
        ax.set_xlabel("α")
        ax.set_ylabel("MATH-500 (ours)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    return _finish(fig, drawn)


@register_figure("schedules")
def schedule_heatmaps(ctx: Context) -> Figure | None:
    """The alpha x lower bound x delta_step grid, one heatmap per agent (AVG accuracy)."""
    grid = ctx.grid("schedules")
    alphas = [float(a) for a in grid.get("algo.alpha", [])]
    lowers = [float(x) for x in grid.get("algo.cross_clip_lower", [])]
    steps = [float(x) for x in grid.get("algo.delta_step", [])]
    if not (alphas and lowers and steps):
        return None
    protocol = ctx.protocol_of("schedules")
    metric = f"eval/{protocol}/avg/acc"
    (p, *_) = ctx.pairs_of("schedules")
    columns = [(lo, st) for lo in lowers for st in steps]
    fig, axes = _panels(len(p.agents), f"Schedules: AVG accuracy of HACPO — {ctx.scale} scale")
    drawn = 0
    for ax, agent in zip(axes, p.agents, strict=True):
        data = [[ctx.value("hacpo", p, agent, metric, "schedules", **{
            "algo.alpha": a, "algo.cross_clip_lower": lo, "algo.delta_step": st}).mean
            for lo, st in columns] for a in alphas]
        values = [[float("nan") if v is None else v for v in row] for row in data]
        drawn += sum(v is not None for row in data for v in row)
        image = ax.imshow(values, cmap="viridis", aspect="auto")
        for i, row in enumerate(data):
            for j, v in enumerate(row):
                light = v is not None and image.norm(v) > 0.6  # dark text on light cells
                ax.text(j, i, "—" if v is None else f"{v:.3f}", ha="center", va="center",
                        fontsize=7, color="black" if light else "white")
        ax.set_xticks(range(len(columns)), [f"{lo:g} / {st:g}" for lo, st in columns],
                      fontsize=7)
        ax.set_yticks(range(len(alphas)), [f"α={a:g}" for a in alphas])
        ax.set_xlabel("lower bound (1 − δ) / δ step")
        ax.set_title(agent, fontsize=9)
        fig.colorbar(image, ax=ax)
    return _finish(fig, drawn)


@register_figure("hacpo_dynamics")
def hacpo_dynamics(ctx: Context) -> Figure | None:
    """Per agent of the size pair's HACPO run: P_k, omega, s_hete (mean, min-max band)."""
    (p, *_) = ctx.pairs_of("table2") or ctx.pairs_of("table1")
    fig, axes = _panels(3, f"HACPO on {p.name}: capability, omega, s_hete per step — "
                           f"{ctx.scale} scale")
    drawn = 0
    for agent in p.agents:
        other = [a for a in p.agents if a != agent]
        for ax, key in zip(axes, ["capability/P", f"omega/{other[0]}", "ratio/s_hete_mean"],
                           strict=True):
            points = _curve(ctx, "hacpo", p, agent, key, "table1")
            if not points:
                continue
            drawn += 1
            line = ax.plot(*zip(*points, strict=True), lw=1.4, label=agent)[0]
            if key == "ratio/s_hete_mean":
                low = dict(_curve(ctx, "hacpo", p, agent, "ratio/s_hete_min", "table1"))
                high = dict(_curve(ctx, "hacpo", p, agent, "ratio/s_hete_max", "table1"))
                steps = [s for s, _ in points if s in low and s in high]
                ax.fill_between(steps, [low[s] for s in steps], [high[s] for s in steps],
                                alpha=0.2, color=line.get_color())
    for ax, label in zip(axes, ["P_k (smoothed capability)", "ω (target / source)",
                                "s_hete (mean, min–max)"], strict=True):
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _finish(fig, drawn)


@register_figure("training_curves")
def training_curves(ctx: Context) -> Figure | None:
    """Reward and response length over steps: HACPO vs GSPO vs GSPOx2 on the size pair."""
    (p, *_) = ctx.pairs_of("table2") or ctx.pairs_of("table1")
    panels = [(p, a, key) for key in ("reward/mean", "response/length_mean") for a in p.agents]
    fig, axes = _panels(len(panels), f"Reward and response length — {ctx.scale} scale")
    drawn = 0
    for ax, (pp, agent, key) in zip(axes, panels, strict=True):
        for method in ("hacpo", "gspo", "gspo_x2"):
            points = _curve(ctx, method, pp, agent, key, "table1")
            if points:
                drawn += 1
                ax.plot(*zip(*points, strict=True), lw=1.2, color=COLORS.get(method),
                        label=METHOD_LABELS.get(method, method))
        ax.set_title(f"{agent}: {key}", fontsize=9)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _finish(fig, drawn)
