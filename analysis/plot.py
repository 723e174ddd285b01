"""`hacrl plot METRIC --by TAG [--where KEY=VALUE ...]`: any logged metric against step, one line
per run, coloured by a tag or setting (method, model, pair, seed, alpha, ...).

`--pair NAME` is a pair's view: its shared-rollout runs (HACPO, Naive, ...) and the single-agent
runs (GSPO, GRPO, ...) of its agents, which carry the agent's name as their pair tag; a colour
per method and a line style per agent."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.context import Pair  # noqa: E402
from analysis.store import Store  # noqa: E402
from hacrl.schema import tags as T  # noqa: E402

ALIASES = {"alpha": "param:algo.alpha", "lower": "param:algo.cross_clip_lower",
           "delta_step": "param:algo.delta_step", "steps": "param:train.steps",
           "kind": T.KIND, "cell": T.CONFIG_HASH}


def column(runs: pd.DataFrame, key: str) -> str:
    """The runs-table column a user's key names (a tag, `param:<name>`, or an alias)."""
    for name in (ALIASES.get(key, key), f"param:{key}"):
        if name in runs.columns:
            return name
    known = sorted({*ALIASES, *(c for c in runs.columns if "/" not in c and c != "run_id")})
    raise ValueError(f"{key!r} is not a tag or setting of the runs; choose one of: "
                     f"{', '.join(known)}")


def _matches(series: pd.Series, value: str) -> pd.Series:
    try:
        number = float(value)
        return pd.to_numeric(series, errors="coerce").sub(number).abs() < 1e-12
    except ValueError:
        return series.astype(str) == value


STYLES = ["-", "--", ":", "-."]


def pair_runs(runs: pd.DataFrame, p: Pair) -> pd.DataFrame:
    """The runs of pair `p`: its shared-rollout runs and its agents' single-agent runs (their
    pair tag is the agent alone)."""
    if not {"pair", "setting", "model"} <= set(runs.columns):
        return runs.iloc[0:0]
    shared = runs["pair"].astype(str) == p.name
    alone = (runs["setting"].astype(str) == "single") & runs["model"].isin(p.agents)
    return runs[shared | alone]


def plot_metric(store: Store, metric: str, by: str, where: list[str], out: Path,
                kind: str = "agent", title: str | None = None,
                pair: Pair | None = None) -> tuple[list[Path], int]:
    """Draw `metric` vs step for every matching run; returns the files written and the number
    of runs drawn. Raises ValueError naming what to change when nothing matches. With `pair`,
    the pair's view: a line style per agent (`model`) on top of the colour per `by`."""
    runs = store.runs
    if kind != "any":
        runs = runs[runs[T.KIND] == kind]
    if pair is not None:
        runs = pair_runs(runs, pair)
        if runs.empty:
            raise ValueError(f"--pair {pair.key}: no {kind} run of this pair or of its agents "
                             "alone")
    for condition in where:
        key, sep, value = condition.partition("=")
        if not sep:
            raise ValueError(f"--where {condition!r}: write KEY=VALUE, e.g. method=hacpo")
        name = column(store.runs, key)
        selected = runs[_matches(runs[name], value)]
        if selected.empty:
            seen = sorted(str(v) for v in runs[name].dropna().unique())
            raise ValueError(f"--where {condition}: no {kind} run has {key}={value}; values "
                             f"present: {', '.join(seen) or 'none'}")
        runs = selected
    group = column(store.runs, by)
    values = sorted(runs[group].astype(str).unique())
    colors = {v: plt.get_cmap("tab10")(i % 10) for i, v in enumerate(values)}
    models = sorted(runs["model"].dropna().astype(str).unique()) if pair is not None else []
    styles = {m: STYLES[i % len(STYLES)] for i, m in enumerate(models)}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn, labelled = 0, set()
    for row in runs.itertuples(index=False):
        run = dict(zip(runs.columns, row, strict=True))
        points = store.history(str(run["run_id"]), metric)
        if not points:
            continue
        label = str(run[group])
        style = styles.get(str(run.get("model")), "-")
        legend = f"{by}={label}" + (f" · {run.get('model')}" if pair is not None else "")
        ax.plot(*zip(*points, strict=True), lw=1.2, color=colors[label], alpha=0.85,
                linestyle=style, label=None if legend in labelled else legend)
        labelled.add(legend)
        drawn += 1
    if not drawn:
        plt.close(fig)
        raise ValueError(f"none of the {len(runs)} matching runs logged {metric!r} (metric names "
                         "look like reward/mean, val/tiny_math500/acc, capability/P)")
    scales = sorted(str(s) for s in runs["scale"].dropna().unique())
    what = f"pair {pair}: " if pair is not None else ""
    ax.set_title(title or f"{what}{metric} by {by} — {', '.join(scales) or 'unknown'} scale",
                 fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    files = [out.with_suffix(".png"), out.with_suffix(".svg")]
    for path in files:
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return files, drawn
