"""A claim's verdict from its comparisons, corrected for testing several at once.

A claim is a family of directional comparisons, each "A > B" given as the paired difference
A - B (`analysis.stats.Difference`, usually its AVG): "HACPO > GSPOx2 for every agent of
every pair" is 6 of them, "the average gain" one (the difference of the agents' mean cells,
`analysis.stats.mean_cell`). Each comparison is

  supported     significant after the correction, in the claimed direction;
  contradicted  significant after the correction, the other way;
  inconclusive  neither: the difference is inside the noise. Its MDE says how large a true
                difference this design would have found (80% power), so "inconclusive"
                reads as "no difference larger than about the MDE", never as "a gain".

Correction: Holm's step-down on the two-sided p-values, which bounds the chance of any false
"supported" or "contradicted" in the family (family-wise error) at `alpha`. A claim like "for
every agent" is a conjunction: one false "supported" among six already misstates it, so the
family-wise error is the one to bound; the false discovery rate (Benjamini-Hochberg) allows a
share of them. Holm needs no assumption on how the comparisons depend on each other (the two
agents of a HACPO run share rollouts, and single-agent baselines are shared between pairs),
and it is uniformly more powerful than Bonferroni. The MDE of a comparison is taken at
alpha / m, Holm's strictest step: what the family could detect whatever its place in the
order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from analysis.stats import Difference, mde

SUPPORTED, CONTRADICTED, INCONCLUSIVE = "supported", "contradicted", "inconclusive"
NOT_TESTABLE = "not testable"


@dataclass(frozen=True)
class Comparison:
    """One comparison of a claim: the difference A - B where the claim says A > B."""

    label: str                       # e.g. "size / qwen3-1.7b-base: HACPO vs GSPOx2"
    verdict: str                     # supported / contradicted / inconclusive / not testable
    estimate: float | None = None
    lo: float | None = None          # the comparison's own 95% interval (not adjusted)
    hi: float | None = None
    p: float | None = None           # two-sided
    p_adjusted: float | None = None  # Holm, within the claim's family
    prob_improvement: float | None = None
    mde: float | None = None         # at 80% power and alpha / m (m: the family's size)
    reason: str = ""                 # why not testable
    n_seeds: int | None = None       # of the paired difference

    def text(self, unit: float = 100.0, unit_name: str = "pt") -> str:
        """One line, e.g. '+0.62 pt [-0.41, +1.65], p 0.23 (Holm 0.46): inconclusive
        (MDE 1.3 pt)'."""
        if self.estimate is None:
            return f"{self.label}: {self.verdict}" + (f" ({self.reason})" if self.reason else "")
        u = unit
        out = (f"{self.label}: {self.estimate * u:+.2f} {unit_name} [{_num(self.lo, u)}, "
               f"{_num(self.hi, u)}], p {_p(self.p)} (Holm {_p(self.p_adjusted)})")
        if self.prob_improvement is not None:
            out += f", P(A > B) {self.prob_improvement:.2f}"
        out += f": {self.verdict}"
        if self.verdict == INCONCLUSIVE and self.mde is not None:
            out += f" (MDE {self.mde * u:.1f} {unit_name})"
        return out


@dataclass(frozen=True)
class ClaimVerdict:
    """A claim's comparisons and the verdict that sums them up."""

    claim: str
    verdict: str                     # e.g. "supported for 4 of 6, inconclusive for 2 (...)"
    comparisons: list[Comparison] = field(default_factory=list)
    alpha: float = 0.05
    correction: str = "Holm"


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm-adjusted p-values, in the input's order: the k-th smallest times (m - k + 1),
    made non-decreasing, at most 1."""
    p = np.asarray(p_values, dtype=float)
    if p.size == 0:
        return p
    order = np.argsort(p, kind="stable")
    steps = (len(p) - np.arange(len(p))) * p[order]
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(steps))
    return adjusted


def judge(claim: str, comparisons: Sequence[tuple[str, Difference | None]], *,
          alpha: float = 0.05, power: float = 0.8, unit: float = 100.0,
          unit_name: str = "pt", missing: str = "runs missing") -> ClaimVerdict:
    """The verdict of `claim` from its comparisons (label, A - B where the claim says A > B;
    None where the runs are missing: `missing` says why). Every Difference needs a p-value
    (a benchmark's or AVG's, not the IQM's)."""
    tested = [d for _, d in comparisons if d is not None]
    if any(d.p is None for d in tested):
        raise ValueError(f"{claim}: every comparison needs a p-value (AVG or a benchmark)")
    m = len(tested)
    adjusted = iter(holm([float(d.p) for d in tested if d.p is not None]))
    out = []
    for label, d in comparisons:
        if d is None:
            out.append(Comparison(label, NOT_TESTABLE, reason=missing))
            continue
        p_adj = float(next(adjusted))
        if p_adj <= alpha:
            verdict = SUPPORTED if d.estimate > 0 else CONTRADICTED
        else:
            verdict = INCONCLUSIVE
        out.append(Comparison(label, verdict, d.estimate, d.lo, d.hi, d.p, p_adj,
                              d.prob_improvement, mde(d.se, d.df, alpha=alpha / m, power=power),
                              n_seeds=d.n_seeds))
    return ClaimVerdict(claim, summarize(out, unit, unit_name), out, alpha)


def summarize(comparisons: Sequence[Comparison], unit: float = 100.0,
              unit_name: str = "pt") -> str:
    """The claim-level verdict: how many comparisons are supported, contradicted and
    inconclusive (with their MDE range), e.g. 'supported for 4 of 6, inconclusive for 2
    (MDE 1.3 pt)'; 'supported' alone only when every comparison is."""
    counts = {v: [c for c in comparisons if c.verdict == v]
              for v in (SUPPORTED, CONTRADICTED, INCONCLUSIVE, NOT_TESTABLE)}
    m = len(comparisons) - len(counts[NOT_TESTABLE])
    if m == 0:
        reasons = sorted({c.reason for c in counts[NOT_TESTABLE] if c.reason})
        return f"{NOT_TESTABLE} ({'; '.join(reasons) or 'runs missing'})"
    parts: list[str] = []
    for verdict in (SUPPORTED, CONTRADICTED, INCONCLUSIVE):
        k = len(counts[verdict])
        if k == 0:
            continue
        if k == m and not counts[NOT_TESTABLE]:
            text = verdict if m == 1 else f"{verdict} ({m} of {m})"
        else:
            text = f"{verdict} for {k}" + (f" of {m}" if not parts else "")
        if verdict == INCONCLUSIVE:
            mdes = sorted(c.mde * unit for c in counts[verdict] if c.mde is not None)
            if mdes:
                span = (f"{mdes[0]:.1f}" if mdes[-1] - mdes[0] < 0.05
                        else f"{mdes[0]:.1f}-{mdes[-1]:.1f}")
                text += f" (MDE {span} {unit_name})"
        parts.append(text)
    if counts[NOT_TESTABLE]:
        parts.append(f"{len(counts[NOT_TESTABLE])} not testable")
    return ", ".join(parts)


def _num(x: float | None, unit: float) -> str:
    return "?" if x is None else f"{x * unit:+.2f}"


def _p(p: float | None) -> str:
    if p is None or math.isnan(p):  # NaN: no p-value (it is not < 0.001)
        return "-"
    return f"{p:.2g}" if p >= 0.001 else "<0.001"
