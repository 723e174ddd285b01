"""The paper's accuracy figures: 2 and 3 (validation accuracy over steps), the alpha ablation and
the schedule heatmaps (final evaluations). Each builder returns a matplotlib Figure (or None when
nothing of it has run), registered under its key (`analysis.table_registry`); `report` saves PNG
and SVG. Curves are means over seeds with a min-max band, scores carry their 95% interval, and
accuracy axes start at 0 (`analysis.figure_kit`). The training dynamics are in
`analysis.figures_dynamics`."""

from __future__ import annotations

from matplotlib.figure import Figure

from analysis.context import Context, Pair
from analysis.figure_kit import (
    COLORS,
    INTERVAL,
    NO_SAMPLES,
    SEED_BAND,
    Score,
    draw_scores,
    draw_seeds,
    finish,
    from_zero,
    legend,
    nice_top,
    panels,
    score,
    seed_curves,
)
from analysis.reference import METHOD_LABELS, paper
from analysis.table_registry import register_figure
from hacrl.schema import metric_names as M


def _val_key(ctx: Context) -> str:
    return M.validation(ctx.logged_benchmark("math500"))


def _method_curves(ctx: Context, title: str, cells: list[tuple[Pair, str]],
                   methods: list[str], sweep: str, key: str, ylabel: str) -> Figure | None:
    fig, axes = panels(len(cells), f"{title}\n{SEED_BAND}")
    drawn = 0
    for ax, (p, agent) in zip(axes, cells, strict=True):
        for method in methods:
            drawn += draw_seeds(ax, seed_curves(ctx, method, p, agent, key, sweep),
                                METHOD_LABELS.get(method, method), COLORS.get(method),
                                marker="o", ms=2.5)
        ax.set_title(f"{agent}  ({p.setting} pair)", fontsize=9)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        legend(ax, fontsize=7)
    from_zero(axes, ylabel)
    return finish(fig, drawn)


@register_figure("figure2")
def figure2(ctx: Context) -> Figure | None:
    """MATH-500 accuracy vs step: HACPO, GSPO, GSPOx2, one panel per agent of each pair."""
    cells = [(p, a) for p in ctx.pairs_of("table1") for a in p.agents]
    return _method_curves(ctx, f"Figure 2: MATH-500 (validation) vs step — {ctx.scale} scale",
                          cells, ["hacpo", "gspo", "gspo_x2"], "table1", _val_key(ctx),
                          "MATH-500 accuracy (validation)")


@register_figure("figure3")
def figure3(ctx: Context) -> Figure | None:
    """Stepwise-clipping ablation on the figure3 pair, trained ~2.5x the usual steps."""
    cells = [(p, a) for p in ctx.pairs_of("figure3") for a in p.agents]
    methods = [str(m) for m in ctx.grid("figure3").get("method", [])]
    return _method_curves(ctx, f"Figure 3: stepwise clipping ablation — {ctx.scale} scale",
                          cells, methods, "figure3", _val_key(ctx),
                          "MATH-500 accuracy (validation)")


@register_figure("alpha")
def alpha_plot(ctx: Context) -> Figure | None:
    """MATH-500 of HACPO vs alpha per agent: ours with 95% intervals, the paper's published
    values (no samples) dashed, on the same axis."""
    alphas = [float(a) for a in ctx.grid("alpha").get("algo.alpha", [])]
    protocol = ctx.protocol_of("alpha")
    ref = paper("alpha_ablation")
    cells = [(p, a) for p in ctx.pairs_of("alpha") for a in p.agents]
    fig, axes = panels(len(cells), f"Alpha ablation: MATH-500 of HACPO — {ctx.scale} scale\n"
                                   f"{INTERVAL}; hollow: {NO_SAMPLES}")
    drawn = 0
    for ax, (p, agent) in zip(axes, cells, strict=True):
        ours = [score(ctx, "hacpo", p, agent, "alpha", protocol, "math500",
                      {"algo.alpha": a}) for a in alphas]
        drawn += draw_scores(ax, alphas, ours, "ours", "#d62728", marker="none")
        pub = ref[(ref["pair"] == p.name) & (ref["model"] == agent)]
        draw_scores(ax, list(pub["alpha"]), [Score(float(v), why=NO_SAMPLES)
                                             for v in pub["value"]],
                    "paper", "#555555", ls="--")
        ax.set_title(agent, fontsize=9)
        ax.set_xlabel("α")
        ax.grid(alpha=0.3)
        legend(ax, fontsize=7, loc="lower right")
    from_zero(axes, "MATH-500 accuracy")
    return finish(fig, drawn)


def _cell_text(s: Score) -> str:
    if s.value is None:
        return "—"
    if not s.has_interval:
        return f"{s.value:.3f}\n{NO_SAMPLES}"
    return f"{s.value:.3f}\n[{s.lo:.3f}, {s.hi:.3f}]"


@register_figure("schedules")
def schedule_heatmaps(ctx: Context) -> Figure | None:
    """The alpha x lower bound x delta_step grid, one heatmap per agent: AVG accuracy and its 95%
    interval in each cell, colours on a scale from 0."""
    grid = ctx.grid("schedules")
    alphas = [float(a) for a in grid.get("algo.alpha", [])]
    lowers = [float(x) for x in grid.get("algo.cross_clip_lower", [])]
    steps = [float(x) for x in grid.get("algo.delta_step", [])]
    if not (alphas and lowers and steps):
        return None
    protocol = ctx.protocol_of("schedules")
    (p, *_) = ctx.pairs_of("schedules")
    columns = [(lo, st) for lo in lowers for st in steps]
    fig, axes = panels(len(p.agents), f"Schedules: AVG accuracy of HACPO — {ctx.scale} scale\n"
                                      "each cell: AVG [95% interval]")
    scores = {agent: [[score(ctx, "hacpo", p, agent, "schedules", protocol, params={
        "algo.alpha": a, "algo.cross_clip_lower": lo, "algo.delta_step": st})
        for lo, st in columns] for a in alphas] for agent in p.agents}
    top = min(1.0, nice_top(max([0.0] + [s.value for rows in scores.values() for row in rows
                                         for s in row if s.value is not None])))
    drawn = 0
    for ax, agent in zip(axes, p.agents, strict=True):
        values = [[float("nan") if s.value is None else s.value for s in row]
                  for row in scores[agent]]
        drawn += sum(s.value is not None for row in scores[agent] for s in row)
        image = ax.imshow(values, cmap="viridis", aspect="auto", vmin=0, vmax=top)
        for i, row in enumerate(scores[agent]):
            for j, s in enumerate(row):
                light = s.value is not None and s.value / top > 0.6  # dark text on light
                ax.text(j, i, _cell_text(s), ha="center", va="center", fontsize=6,
                        color="black" if light else "white")
        ax.set_xticks(range(len(columns)), [f"{lo:g} / {st:g}" for lo, st in columns],
                      fontsize=7)
        ax.set_yticks(range(len(alphas)), [f"α={a:g}" for a in alphas])
        ax.set_xlabel("lower bound (1 − δ) / δ step")
        ax.set_title(agent, fontsize=9)
        bar = fig.colorbar(image, ax=ax)
        bar.set_label(f"AVG accuracy (colour scale from 0 to {top:g})", fontsize=7)
    return finish(fig, drawn)
