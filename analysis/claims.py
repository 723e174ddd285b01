"""The paper's qualitative claims, checked against the runs at hand (and, for reference, against
the paper's own numbers)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from analysis.reference import METHOD_LABELS
from analysis.table import Table


@dataclass
class Claim:
    text: str
    verdict: str = "not testable (runs missing)"   # supported / not supported / partly / ...
    paper_verdict: str = ""
    details: list[str] = field(default_factory=list)


def _avg(table: Table, section: str, agent: str, method: str) -> tuple[float | None, float | None]:
    row = f"{agent} · {METHOD_LABELS.get(method, method)}"
    for s, r, entries in table.rows:
        if s == section and r == row:
            e = entries[table.columns.index("AVG")]
            return (e.ours.mean if e.ours else None), e.paper
    return None, None


def _agents(table: Table) -> list[tuple[str, str]]:
    return list(dict.fromkeys((s, r.split(" · ")[0]) for s, r, _ in table.rows))


def _verdict(signs: list[bool]) -> str:
    if not signs:
        return "not testable (runs missing)"
    if all(signs):
        return "supported"
    return "not supported" if not any(signs) else f"partly ({sum(signs)} of {len(signs)})"


def _compare(claim: Claim, table: Table, better: str, worse: str) -> Claim:
    """`better` has a higher AVG than `worse` for every agent of the table."""
    ours, theirs = [], []
    for section, agent in _agents(table):
        b, b_paper = _avg(table, section, agent, better)
        w, w_paper = _avg(table, section, agent, worse)
        if b is not None and w is not None:
            ours.append(b > w)
            claim.details.append(f"{section} / {agent}: {METHOD_LABELS.get(better, better)} "
                                 f"{b:.3f} vs {METHOD_LABELS.get(worse, worse)} {w:.3f} "
                                 f"({b - w:+.3f})")
        else:
            claim.details.append(f"{section} / {agent}: missing runs")
        if b_paper is not None and w_paper is not None:
            theirs.append(b_paper > w_paper)
    claim.verdict, claim.paper_verdict = _verdict(ours), _verdict(theirs)
    return claim


def check(tables: dict[str, Table]) -> list[Claim]:
    claims = []
    if "table1" in tables:
        t1 = tables["table1"]
        claims.append(_compare(Claim("HACPO is above GSPOx2 (AVG) for every agent of every "
                                     "Table-1 pair"), t1, "hacpo", "gspo_x2"))
        claims.append(_compare(Claim("Naive sharing is below GSPO (AVG) for every agent"),
                               t1, "gspo", "naive"))
        gains, paper_gains = [], []
        for section, agent in _agents(t1):
            h, h_paper = _avg(t1, section, agent, "hacpo")
            g, g_paper = _avg(t1, section, agent, "gspo_x2")
            if h is not None and g is not None:
                gains.append(100 * (h - g))
            if h_paper is not None and g_paper is not None:
                paper_gains.append(100 * (h_paper - g_paper))
        gain = Claim("Average gain of HACPO over GSPOx2 (paper: +3.6 points)")
        if gains:
            gain.verdict = (f"{statistics.fmean(gains):+.2f} points over {len(gains)} agents "
                            f"({'a gain' if statistics.fmean(gains) > 0 else 'no gain'})")
        if paper_gains:
            gain.paper_verdict = f"{statistics.fmean(paper_gains):+.2f} points (recomputed)"
        claims.append(gain)
    for key, method, what in (("table2", "hacpo_no_adv", "the capability-aware advantage"),
                              ("table3", "hacpo_no_omega", "omega")):
        if key in tables:
            claims.append(_compare(Claim(f"Removing {what} lowers AVG"), tables[key],
                                   "hacpo", method))
    if "table7" in tables:
        t7 = tables["table7"]
        totals = {r: es[t7.columns.index("total")] for _, r, es in t7.rows}
        mine = totals.get(METHOD_LABELS["hacpo"])
        base = totals.get(METHOD_LABELS["gspo_x2"])
        claim = Claim("HACPO takes less wall time than GSPOx2 (both agents)")
        h = mine.ours.mean if mine and mine.ours else None
        g = base.ours.mean if base and base.ours else None
        if h and g:
            claim.verdict = "supported" if h < g else "not supported"
            claim.details.append(f"HACPO {h:.1f} s vs GSPOx2 {g:.1f} s (ratio {h / g:.2f})")
        if mine and base and mine.paper and base.paper:
            claim.paper_verdict = ("supported" if mine.paper < base.paper else "not supported") \
                + f" ({mine.paper:.0f} vs {base.paper:.0f} min)"
        claims.append(claim)
    return claims
