"""How HACPO trains, over steps: P_k, omega and s_hete per agent (`hacpo_dynamics`), reward and
response length of HACPO, GSPO and GSPOx2 (`training_curves`). Every curve is the mean over the
cell's seeds with a min-max band over seeds (`analysis.figure_kit`); axes start at 0."""

from __future__ import annotations

from matplotlib.figure import Figure

from analysis.context import Context
from analysis.figure_kit import (
    COLORS,
    SEED_BAND,
    draw_seeds,
    finish,
    from_zero,
    legend,
    panels,
    seed_curves,
)
from analysis.reference import METHOD_LABELS
from analysis.table_registry import register_figure
from hacrl.schema import metric_names as M


@register_figure("hacpo_dynamics")
def hacpo_dynamics(ctx: Context) -> Figure | None:
    """Per agent of the size pair's HACPO cell: P_k, omega and s_hete (dotted: the batch's min and
    max of s_hete, each averaged over seeds, without a band)."""
    (p, *_) = ctx.pairs_of("table2") or ctx.pairs_of("table1")
    fig, axes = panels(3, f"HACPO on {p.name}: capability, omega, s_hete per step — "
                          f"{ctx.scale} scale\n{SEED_BAND}")
    drawn = 0
    for i, agent in enumerate(p.agents):
        other = [a for a in p.agents if a != agent]
        keys = [M.CAPABILITY, M.omega(other[0]), M.ratio(M.S_HETE, "mean")]
        for ax, key in zip(axes, keys, strict=True):
            drawn += draw_seeds(ax, seed_curves(ctx, "hacpo", p, agent, key, "table1"), agent,
                                f"C{i}")
        for bound in ("min", "max"):
            draw_seeds(axes[2], seed_curves(ctx, "hacpo", p, agent, M.ratio(M.S_HETE, bound),
                                            "table1"), None, f"C{i}", band=False,
                       ls=":", lw=0.9)
    for ax in axes:
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        legend(ax, fontsize=6)
    from_zero(axes[:1], "P_k (smoothed capability)")
    from_zero(axes[1:2], "ω (target / source)", ceiling=None, reference=1.0)
    from_zero(axes[2:], "s_hete (dotted: batch min, max;\nmeans over seeds)", ceiling=None, reference=1.0)
    return finish(fig, drawn)


@register_figure("training_curves")
def training_curves(ctx: Context) -> Figure | None:
    """Reward and response length over steps: HACPO vs GSPO vs GSPOx2 on the size pair."""
    (p, *_) = ctx.pairs_of("table2") or ctx.pairs_of("table1")
    keys = {M.REWARD_MEAN: "mean reward", M.RESPONSE_LENGTH_MEAN: "response length (tokens)"}
    cells = [(a, key) for key in keys for a in p.agents]
    fig, axes = panels(len(cells), f"Reward and response length — {ctx.scale} scale\n"
                                   f"{SEED_BAND}")
    drawn = 0
    for ax, (agent, key) in zip(axes, cells, strict=True):
        for method in ("hacpo", "gspo", "gspo_x2"):
            drawn += draw_seeds(ax, seed_curves(ctx, method, p, agent, key, "table1"),
                                METHOD_LABELS.get(method, method), COLORS.get(method), lw=1.2)
        ax.set_title(f"{agent}: {key}", fontsize=9)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        legend(ax, fontsize=7)
    for key, label in keys.items():
        from_zero([ax for ax, (_, k) in zip(axes, cells, strict=True) if k == key], label,
                  ceiling=1.0 if key == M.REWARD_MEAN else None)
    return finish(fig, drawn)
