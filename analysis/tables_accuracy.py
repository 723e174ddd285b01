"""Accuracy tables: Table 1 (main), 2 and 3 (ablations), 9 (appendix pairs), 6 (seeds), alpha."""

from __future__ import annotations

import math
import statistics
from typing import Any

from analysis.cell_values import Value
from analysis.context import Context, Pair
from analysis.evidence import CellSamples, Evidence, evidence_of
from analysis.reference import BENCHMARKS, LABELS, METHOD_LABELS, benchmark_values, paper
from analysis.seed_stats import NO_SAMPLES, paired_seed_difference, seed_mean
from analysis.stats import AVG, IQM, Estimate
from analysis.table import Entry, Table
from analysis.table_registry import register_table

PRINTED_AVG_TOLERANCE = 0.0015  # PAPER.md: printed AVGs off by more than this are quirks


def _average(parts: list[Value]) -> Value:
    """AVG recomputed as the mean of the benchmark cells, run by run (seeds stay apart)."""
    missing = [p for p in parts if p.mean is None]
    if missing:
        reasons = {p.reason for p in missing}
        if len(missing) == len(parts) and len(reasons) == 1:  # e.g. the run failed
            return Value(run_ids=missing[0].run_ids, reason=reasons.pop())
        return Value(reason=f"{len(missing)} of {len(parts)} benchmarks missing")
    n = min(p.n for p in parts)
    values = [statistics.fmean(p.values[i] for p in parts) for i in range(n)]
    return Value(values, sorted({r for p in parts for r in p.run_ids}))


def _paper_avg(paper_cells: list[float | None], printed: float | None) -> tuple[float | None, str]:
    if any(v is None for v in paper_cells):
        return printed, "printed" if printed is not None else ""
    mean = statistics.fmean(v for v in paper_cells if v is not None)
    note = ""
    if printed is not None and abs(printed - mean) > PRINTED_AVG_TOLERANCE:
        note = f"printed {printed:.3f}"
    return mean, note


def benchmark_table(ctx: Context, key: str, title: str, sweep: str, reference: str,
                    baseline: str | None = "gspo_x2") -> Table:
    """Per pair and agent: every method of the sweep's grid on the seven benchmarks and AVG
    (recomputed); in the AVG cell, the difference to `baseline` in brackets, as the paper."""
    protocol = ctx.protocol_of(sweep)
    methods = ctx.grid(sweep).get("method", [])
    methods = [str(m) for m in (methods if isinstance(methods, list) else [methods])]
    published = benchmark_values(reference)
    table = Table(key, f"{title} — {ctx.scale_note}; protocol `{protocol}`",
                  [LABELS[b] for b in BENCHMARKS] + ["AVG", "IQM"])
    evidence = evidence_of(ctx)
    names = [ctx.logged_benchmark(b) for b in BENCHMARKS] + [AVG, IQM]
    mdes: list[float] = []
    for p in ctx.pairs_of(sweep):
        for agent in p.agents:
            rows: dict[str, list[Entry]] = {}
            samples: dict[str, CellSamples] = {}
            for method in methods:
                parts = [ctx.value(method, p, agent, ctx.benchmark_metric(protocol, b), sweep)
                         for b in BENCHMARKS]
                pub = [published.get((p.name, agent, method, b)) for b in BENCHMARKS]
                avg_paper, note = _paper_avg(pub, published.get((p.name, agent, method,
                                                                  "avg_printed")))
                rows[method] = [Entry(v, pv) for v, pv in zip(parts, pub, strict=True)]
                rows[method].append(Entry(_average(parts), avg_paper, paper_note=note))
                rows[method].append(Entry(_iqm(parts), _paper_iqm(pub)))
                samples[method] = evidence.cell(method, p, agent, sweep, protocol)
                _intervals(rows[method], names, samples[method], evidence.estimates(samples[method]))
            if baseline in rows:
                base = rows[baseline][AVG_COLUMN]
                for method, entries in rows.items():
                    avg = entries[AVG_COLUMN]
                    if method == baseline or base.ours is None or avg.ours is None:
                        continue
                    diff = evidence.paired(samples[method], samples[baseline])
                    if diff is not None:
                        d = diff[AVG]
                        avg.extra = f"[{d.estimate:+.3f} ({d.lo:+.3f}, {d.hi:+.3f})]"
                        mdes.append(d.mde or math.nan)
                    elif avg.ours.mean is not None and base.ours.mean is not None:
                        avg.extra = f"[{avg.ours.mean - base.ours.mean:+.3f}, no samples]"
                    if avg.paper is not None and base.paper is not None:
                        avg.paper_extra = f"[{avg.paper - base.paper:+.3f}]"
            for method, entries in rows.items():
                table.add(p.name, f"{agent} · {METHOD_LABELS.get(method, method)}", entries)
    table.notes += [
        "Each cell: ours, the mean over seeds (n = the number of runs), with its 95% interval "
        "in brackets: a bootstrap over the benchmark's problems and, with several seeds, over "
        "seeds (analysis/stats.py); then the paper's value and ours − paper. Where the runs "
        "logged no per-problem outcomes there is no interval: mean ± sample std over runs, "
        "marked `no samples`. AVG is the mean of the seven cells; when the paper printed a "
        "different AVG it is shown as `printed`.",
        f"Brackets after the AVG interval: the difference to "
        f"{METHOD_LABELS.get(baseline or '', '')} of the same agent, paired over the seeds "
        "both ran and the same problems, with its 95% interval (the claims above test it)."
        if baseline else "",
        "Single-agent methods train each agent alone, shared by every pair the agent is in; "
        "the base models are evaluated once.",
        "AIME2025: ours is avg@k with the protocol's k samples (see the run's protocol tag).",
        "IQM: the interquartile mean of the seven benchmarks (the middle five), with its "
        "interval from the same bootstrap; the paper's is computed from its seven values.",
        "The paper's values have no per-problem samples: they carry no interval.",
        _precision(evidence, mdes),
    ]
    table.notes = [n for n in table.notes if n]
    return table


AVG_COLUMN = len(BENCHMARKS)  # the AVG entry of a row (IQM follows it)


def _iqm(parts: list[Value]) -> Value:
    """The interquartile mean of the benchmarks' means (25% trimmed at each end)."""
    from scipy.stats import trim_mean

    if any(p.mean is None for p in parts):
        return Value(reason="benchmarks missing")
    return Value([float(trim_mean([p.mean for p in parts], 0.25))],
                 sorted({r for p in parts for r in p.run_ids}))


def _paper_iqm(published: list[float | None]) -> float | None:
    from scipy.stats import trim_mean

    values = [v for v in published if v is not None]
    return float(trim_mean(values, 0.25)) if len(values) == len(published) else None


def _precision(evidence: Evidence, mdes: list[float]) -> str:
    """What this design can see: the standard error of AVG over problems (one run), of a
    cell's AVG over problems and seeds, and the MDE of the paired differences in brackets."""
    design = evidence.precision()
    if design is None:
        return ""
    text = (f"Precision (points): the SE of one run's AVG over its problems is "
            f"{design.run_se_median * 100:.2f} (median; max {design.run_se_max * 100:.2f}) with "
            f"{design.problems} problems over 7 benchmarks; a cell's AVG over problems and its "
            f"{design.seeds_text} has SE {design.cell_se_median * 100:.2f} (median; max "
            f"{design.cell_se_max * 100:.2f}).")
    finite = sorted(m for m in mdes if not math.isnan(m))
    if finite:
        text += (f" A paired AVG difference (the brackets) is detected with 80% power at "
                 f"alpha 0.05 from {finite[0] * 100:.1f} points (MDE; median "
                 f"{statistics.median(finite) * 100:.1f}).")
    return text


def _with_interval(entry: Entry, ctx: Context, method: str, p: Pair, agent: str, sweep: str,
                   protocol: str, benchmark: str, **params: Any) -> Entry:
    """`entry` with the 95% interval of one benchmark from the cell's outcomes (or why not)."""
    if entry.ours is None or entry.ours.mean is None:
        return entry
    evidence = evidence_of(ctx)
    samples = evidence.cell(method, p, agent, sweep, protocol, **params)
    _intervals([entry], [ctx.logged_benchmark(benchmark)], samples, evidence.estimates(samples))
    return entry


def _intervals(entries: list[Entry], names: list[str], samples: CellSamples,
               estimates: dict[str, Estimate] | None) -> None:
    """Each entry's 95% interval from the cell's per-problem outcomes, or why it has none."""
    for entry, name in zip(entries, names, strict=True):
        if entry.ours is None or entry.ours.mean is None:
            continue
        if estimates is None:
            entry.uncertainty = samples.reason if samples.runs else ""
        elif name in estimates:
            entry.interval = (estimates[name].lo, estimates[name].hi)


@register_table("table1")
def table1(ctx: Context) -> Table:
    return benchmark_table(ctx, "table1", "Table 1: main results", "table1", "table1_main")


@register_table("table2")
def table2(ctx: Context) -> Table:
    return benchmark_table(ctx, "table2", "Table 2: without the capability-aware advantage",
                           "table2", "table2_adv_ablation", baseline="hacpo")


@register_table("table3")
def table3(ctx: Context) -> Table:
    return benchmark_table(ctx, "table3", "Table 3: without omega in the gradient modulation",
                           "table3", "table3_omega_ablation", baseline="hacpo")


@register_table("table9")
def table9(ctx: Context) -> Table:
    return benchmark_table(ctx, "table9", "Table 9: additional pairs", "table9",
                           "table9_additional")


# Table 6's paired rows: (A, B) -> the row "A − B", per seed and summed up
SEED_DIFFERENCES = (("hacpo", "gspo"), ("hacpo", "gspo_x2"))


@register_table("table6")
def seeds_table(ctx: Context) -> Table:
    """Table 6: MATH-500 per seed and mean ± std (ddof = 1) for each agent and method, the
    mean's 95% t-interval, and the paired (by seed) differences HACPO − GSPO and HACPO −
    GSPOx2 with interval, p-value and MDE; ours and the paper's alike (`analysis.seed_stats`)."""
    grid = ctx.grid("seeds")
    seeds = [int(s) for s in grid.get("seed", [])]
    protocol = ctx.protocol_of("seeds")
    metric = ctx.benchmark_metric(protocol, "math500")
    per_seed = paper("seeds")
    summary = paper("seed_summary")
    table = Table("table6", f"Table 6: MATH-500 over seeds — {ctx.scale_note}; protocol "
                  f"`{protocol}`", [f"seed {s}" for s in seeds] + ["mean ± std"])
    for p in ctx.pairs_of("seeds"):
        for agent in p.agents:
            by_method: dict[str, tuple[list[Value], dict[int, float]]] = {}
            for method in grid.get("method", []):
                method = str(method)
                entries = []
                values = []
                published: dict[int, float] = {}
                for seed in seeds:
                    v = ctx.value(method, p, agent, metric, "seeds", seed=seed)
                    match = per_seed[(per_seed["pair"] == p.name) & (per_seed["model"] == agent)
                                     & (per_seed["method"] == method) & (per_seed["seed"] == seed)]
                    if len(match):
                        published[seed] = float(match["value"].iloc[0])
                    entries.append(_with_interval(
                        Entry(v, published.get(seed)), ctx, method, p, agent, "seeds", protocol,
                        "math500", seed=seed))
                    values.append(v)
                row = summary[(summary["pair"] == p.name) & (summary["model"] == agent)
                              & (summary["method"] == method)]
                mean = float(row["mean_percent"].iloc[0]) / 100 if len(row) else None
                note = f"± {float(row['std_percent'].iloc[0]) / 100:.4f}" if len(row) else ""
                ours = Value.combine(values)
                ours_ci = seed_mean(ours.values)
                entries.append(Entry(ours, mean, digits=4, paper_note=note,
                                     extra=f"[{ours_ci.text()}]" if ours_ci.lo is not None else "",
                                     paper_extra=f"[{seed_mean(list(published.values())).text()}]"
                                     if mean is not None else ""))
                by_method[method] = (values, published)
                table.add(p.name, f"{agent} · {METHOD_LABELS.get(method, method)}", entries)
            for better, worse in SEED_DIFFERENCES:
                if better in by_method and worse in by_method:
                    table.add(p.name, f"{agent} · {METHOD_LABELS[better]} − {METHOD_LABELS[worse]}",
                              _seed_difference(seeds, by_method[better], by_method[worse]))
    table.notes += [
        "mean ± std: sample standard deviation (ddof = 1), as the paper; in brackets the mean's "
        "95% t-interval over seeds (n − 1 df). A seed the paper does not give shows no paper "
        "value (not 0).",
        "Rows A − B: the difference seed by seed (the same seed for both methods); last column: "
        "its mean, 95% t-interval, two-sided paired t-test p and the MDE (80% power, two-sided "
        "α = 0.05) of this many seeds at the observed spread.",
        "Every seed is evaluated on the same problems (the paper's 500, ours the protocol's): "
        "these intervals hold the seed-to-seed (training) noise, not the problem sampling; they "
        "are about these problems. Statistics without per-seed values say `no samples` "
        "(never 0).",
    ]
    return table


def _seed_difference(seeds: list[int], a: tuple[list[Value], dict[int, float]],
                     b: tuple[list[Value], dict[int, float]]) -> list[Entry]:
    """The entries of a row A − B: per seed (ours where both ran, the paper's where it gives
    both), then the paired statistics of each."""
    (a_values, a_paper), (b_values, b_paper) = a, b
    entries, parts = [], []
    ours_a: dict[int, float] = {}
    ours_b: dict[int, float] = {}
    for seed, va, vb in zip(seeds, a_values, b_values, strict=True):
        if va.mean is not None and vb.mean is not None:
            ours_a[seed], ours_b[seed] = va.mean, vb.mean
            part = Value([va.mean - vb.mean], va.run_ids + vb.run_ids)
        else:
            part = Value(reason=(va if va.mean is None else vb).reason or "not run")
        published = a_paper[seed] - b_paper[seed] if seed in a_paper and seed in b_paper else None
        entries.append(Entry(part, published, digits=4))
        parts.append(part)
    ours = paired_seed_difference(ours_a, ours_b)
    theirs = paired_seed_difference(a_paper, b_paper)
    entries.append(Entry(Value.combine(parts), theirs.estimate, digits=4,
                         extra=f"[{ours.stats_text()}]" if ours.n > 1 else "",
                         paper_extra=f"[{theirs.stats_text()}]" if theirs.n > 1 else "",
                         paper_note="" if theirs.estimate is not None else NO_SAMPLES))
    return entries


@register_table("alpha")
def alpha_table(ctx: Context) -> Table:
    """MATH-500 of HACPO for alpha in the sweep's grid, per pair and agent."""
    grid = ctx.grid("alpha")
    alphas = [float(a) for a in grid.get("algo.alpha", [])]
    protocol = ctx.protocol_of("alpha")
    metric = ctx.benchmark_metric(protocol, "math500")
    ref = paper("alpha_ablation")
    table = Table("alpha", f"Alpha ablation: MATH-500 of HACPO — {ctx.scale_note}; protocol "
                  f"`{protocol}`", [f"α = {a:g}" for a in alphas])
    for p in ctx.pairs_of("alpha"):
        for agent in p.agents:
            entries = []
            for a in alphas:
                v = ctx.value("hacpo", p, agent, metric, "alpha", **{"algo.alpha": a})
                match = ref[(ref["pair"] == p.name) & (ref["model"] == agent)
                            & (ref["alpha"] == a)]
                entries.append(_with_interval(
                    Entry(v, float(match["value"].iloc[0]) if len(match) else None), ctx,
                    "hacpo", p, agent, "alpha", protocol, "math500", **{"algo.alpha": a}))
            table.add(p.name, agent, entries)
    table.notes.append("Each cell: ours with its 95% interval over the benchmark's problems "
                       "(and seeds, when several), then the paper's value.")
    return table
