"""The paper's claims as verdicts with evidence, judged on the runs at hand.

Each claim is a family of directional comparisons ("HACPO > GSPOx2 for every agent of every
Table-1 pair": six). Each comparison is the paired difference of the two cells' AVG over the
seeds both ran and the same problems (`analysis.evidence`, `analysis.stats`), with its 95%
interval and p-value; `analysis.verdicts.judge` calls it supported / contradicted /
inconclusive after Holm's correction within the claim (alpha 0.05), and an inconclusive one
carries the minimum detectable effect of this design. Nothing is called a gain from a
difference inside its interval. Runs without per-problem outcomes cannot be tested: they say so
and show the plain difference of their means.

The paper's own numbers have no per-problem samples (and Table 1 one run per cell), so its side
of a claim is the count of agents where it holds, marked untested; Table 6 (five seeds) is where
the report puts the paper's numbers through the same lens (`analysis.seed_stats`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from analysis.context import Context, Pair
from analysis.evidence import CellSamples, evidence_of
from analysis.power import design_from_record, plan
from analysis.reference import METHOD_LABELS, pilot_designs
from analysis.reference import headline as paper_headline
from analysis.stats import AVG, Difference, mean_cell, paired_difference
from analysis.table import Table
from analysis.verdicts import NOT_TESTABLE, ClaimVerdict, Comparison, judge

ALPHA = 0.05


@dataclass
class Claim:
    text: str
    verdict: str = f"{NOT_TESTABLE} (runs missing)"
    paper_verdict: str = ""
    details: list[str] = field(default_factory=list)
    method: str = ""                  # how the verdict was reached (test, correction, level)


def _label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


def _avg(table: Table, section: str, agent: str, method: str) -> tuple[float | None, float | None]:
    row = f"{agent} · {_label(method)}"
    for s, r, entries in table.rows:
        if s == section and r == row:
            e = entries[table.columns.index("AVG")]
            return (e.ours.mean if e.ours else None), e.paper
    return None, None


def _paper_side(table: Table, pairs: list[Pair], better: str, worse: str) -> str:
    """How often the paper's printed AVGs put `better` above `worse` (no samples: untested)."""
    signs = []
    for p in pairs:
        for agent in p.agents:
            _, b = _avg(table, p.name, agent, better)
            _, w = _avg(table, p.name, agent, worse)
            if b is not None and w is not None:
                signs.append(b > w)
    if not signs:
        return ""
    return (f"holds for {sum(signs)} of {len(signs)} agents (one run per cell, no per-problem "
            "samples: not tested)")


def _judged(claim: Claim, verdict: ClaimVerdict, reasons: dict[str, str],
            seeds: list[int] | None = None) -> Claim:
    claim.verdict = verdict.verdict
    m = sum(c.verdict != NOT_TESTABLE for c in verdict.comparisons)
    claim.method = (f"paired over seeds and problems; Holm over {m} comparison"
                    f"{'s' if m != 1 else ''}, alpha {verdict.alpha:g}") if m else ""
    if m and seeds and min(seeds) == 1:
        # one run per method: the test sees the problems' sampling, not how much another seed
        # would move the result, so it speaks about these runs rather than the methods
        claim.method += ("; one seed: the test covers problem sampling only, not seed-to-seed "
                         "variation (more seeds: scale.seeds or the sweep's seed axis)")
    claim.details = [c.text() if c.verdict != NOT_TESTABLE else
                     f"{c.label}: {NOT_TESTABLE} ({reasons.get(c.label, c.reason)})"
                     for c in verdict.comparisons]
    return claim


def _untested(ctx: Context, table: Table, p: Pair, agent: str, a: CellSamples, b: CellSamples,
              better: str, worse: str) -> str:
    """Why a comparison has no test, with the plain difference of the means when there is one."""
    why = a.reason or b.reason or "no seed in common"
    hi, _ = _avg(table, p.name, agent, better)
    lo, _ = _avg(table, p.name, agent, worse)
    if hi is None or lo is None:
        return why
    return f"{why}; {_label(better)} {hi:.3f} vs {_label(worse)} {lo:.3f} ({hi - lo:+.3f})"


def compare(ctx: Context, claim: Claim, table: Table, sweep: str, better: str,
            worse: str) -> Claim:
    """`better` has a higher AVG than `worse` for every agent of the sweep's pairs."""
    evidence = evidence_of(ctx)
    protocol = ctx.protocol_of(sweep)
    pairs = ctx.pairs_of(sweep)
    comparisons: list[tuple[str, Difference | None]] = []
    reasons: dict[str, str] = {}
    seeds: list[int] = []
    for p in pairs:
        for agent in p.agents:
            label = f"{p.name} / {agent}: {_label(better)} − {_label(worse)}"
            a = evidence.cell(better, p, agent, sweep, protocol)
            b = evidence.cell(worse, p, agent, sweep, protocol)
            diff = evidence.paired(a, b)
            comparisons.append((label, diff[AVG] if diff else None))
            if diff is None:
                reasons[label] = _untested(ctx, table, p, agent, a, b, better, worse)
            else:
                seeds.append(diff[AVG].n_seeds)
    verdict = judge(claim.text, comparisons, alpha=ALPHA)
    claim = _judged(claim, verdict, reasons, seeds)
    claim.paper_verdict = _paper_side(table, pairs, better, worse)
    if ctx.scale == "tiny" and (better, worse) == ("hacpo", "gspo_x2"):
        tested = sum(c.estimate is not None for c in verdict.comparisons)
        powered = [_with_power(line, c, tested)
                   for line, c in zip(claim.details, verdict.comparisons, strict=True)]
        predicted = powered != claim.details
        claim.details = powered
        if predicted and (pilot := pilot_designs()):
            claim.details.append(f"predicted MDEs: the design each agent showed in a pilot "
                                 f"(analysis/reference/tiny/designs.json, "
                                 f"{pilot['measured']['source']}) at the seeds run here")
    return claim


def _with_power(line: str, comparison: Comparison, family: int) -> str:
    """`line` with the comparison's measured MDE and the one its design predicted from the tiny
    pilot (analysis/reference/tiny/designs.json, scripts/tiny_design.py) at its seed count."""
    designs = pilot_designs()
    key = comparison.label.split(": ")[0].replace(" / ", "/")
    if comparison.mde is None or comparison.n_seeds is None or key not in designs:
        return line
    predicted = plan(design_from_record(designs[key]).with_seeds(comparison.n_seeds),
                     alpha=ALPHA / family).mde
    said = f"predicted {100 * predicted:.1f} pt for {comparison.n_seeds} seeds"
    mde_text = f"(MDE {100 * comparison.mde:.1f} pt)"
    if line.endswith(mde_text):  # inconclusive: its MDE is already there
        return f"{line[:-1]}; {said})"
    return f"{line} (MDE {100 * comparison.mde:.1f} pt; {said})"


def average_gain(ctx: Context, table: Table, sweep: str, better: str, worse: str,
                 headline: str) -> Claim:
    """The mean over agents of `better` − `worse` (AVG), as one paired difference: the agents'
    cells averaged problem by problem over the seeds every one of them ran. `headline`: the
    paper's number for it in reference/paper/headlines.csv (it differs between versions)."""
    paper_gain, versions = paper_headline(headline)
    claim = Claim(f"Average gain of {_label(better)} over {_label(worse)} (paper: "
                  f"{paper_gain:+.1f} points)")
    evidence = evidence_of(ctx)
    protocol = ctx.protocol_of(sweep)
    cells = [(evidence.cell(better, p, agent, sweep, protocol),
              evidence.cell(worse, p, agent, sweep, protocol))
             for p in ctx.pairs_of(sweep) for agent in p.agents]
    usable = [(a, b) for a, b in cells if a.scores is not None and b.scores is not None]
    common = sorted(set.intersection(*[set(a.runs) & set(b.runs) for a, b in usable])) \
        if usable else []
    diff = None
    if usable and len(usable) == len(cells) and common:
        diff = paired_difference(mean_cell([a.for_seeds(common) for a, _ in usable]),
                                 mean_cell([b.for_seeds(common) for _, b in usable]),
                                 n_boot=evidence.n_boot)
    label = f"mean over {len(cells)} agents, seeds {common}" if diff else "mean over agents"
    reasons = {label: "no samples for every agent" if cells else "runs missing"}
    claim = _judged(claim, judge(claim.text, [(label, diff[AVG] if diff else None)],
                                 alpha=ALPHA), reasons, [len(common)] if diff else None)
    paper_gains = []
    for p in ctx.pairs_of(sweep):
        for agent in p.agents:
            _, b = _avg(table, p.name, agent, better)
            _, w = _avg(table, p.name, agent, worse)
            if b is not None and w is not None:
                paper_gains.append(100 * (b - w))
    if paper_gains:
        claim.paper_verdict = (f"{statistics.fmean(paper_gains):+.2f} points (recomputed from "
                               f"its table; no per-problem samples: not tested; {versions})")
    return claim


def cost_claim(table: Table) -> Claim:
    """HACPO's total wall time below GSPOx2's: Welch's t-test over the timing repeats."""
    from scipy import stats

    totals = {r: es[table.columns.index("total")] for _, r, es in table.rows}
    mine, base = totals.get(_label("hacpo")), totals.get(_label("gspo_x2"))
    claim = Claim("HACPO takes less wall time than GSPOx2 (both agents)")
    h = mine.ours.values if mine and mine.ours else []
    g = base.ours.values if base and base.ours else []
    if h and g:
        ratio = statistics.fmean(h) / statistics.fmean(g)
        text = (f"HACPO {statistics.fmean(h):.1f} s vs GSPOx2 {statistics.fmean(g):.1f} s "
                f"(n = {len(h)} and {len(g)} repeats; ratio {ratio:.2f})")
        if len(h) >= 2 and len(g) >= 2:
            p = float(stats.ttest_ind(h, g, equal_var=False).pvalue)
            verdict = ("inconclusive" if p > ALPHA else
                       "supported" if ratio < 1 else "contradicted")
            claim.verdict = verdict
            claim.method = f"Welch's t-test over the timing repeats, alpha {ALPHA:g}"
            text += f", Welch p {p:.2g}"
        else:
            claim.verdict = f"{NOT_TESTABLE} (one repeat per method: no spread to test against)"
        claim.details.append(text)
    if mine and base and mine.paper and base.paper:
        claim.paper_verdict = (f"{mine.paper:.0f} vs {base.paper:.0f} min (one run each: not "
                               "tested)")
    return claim


def check(tables: dict[str, Table], ctx: Context) -> list[Claim]:
    claims = []
    if "table1" in tables:
        t1 = tables["table1"]
        claims.append(compare(ctx, Claim("HACPO is above GSPOx2 (AVG) for every agent of every "
                                         "Table-1 pair"), t1, "table1", "hacpo", "gspo_x2"))
        claims.append(compare(ctx, Claim("Naive sharing is below GSPO (AVG) for every agent"),
                              t1, "table1", "gspo", "naive"))
        claims.append(average_gain(ctx, t1, "table1", "hacpo", "gspo_x2",
                                   "hacpo_over_gspo_x2_avg"))
    for key, method, what in (("table2", "hacpo_no_adv", "the capability-aware advantage"),
                              ("table3", "hacpo_no_omega", "omega")):
        if key in tables:
            claims.append(compare(ctx, Claim(f"Removing {what} lowers AVG"), tables[key], key,
                                  "hacpo", method))
    if "table7" in tables:
        claims.append(cost_claim(tables["table7"]))
    return claims
