"""Statistics from one number per seed (Table 6: MATH-500 of five seeds), for ours and for
the paper's published values alike.

What these numbers can and cannot say: the paper evaluated the same 500 MATH-500 problems
for every seed, so the seed-to-seed spread holds the training noise (and which of those
problems a run gets right), not the problem sampling. A t-interval over seeds is about
accuracy on these 500 problems; on MATH-like problems in general it would be wider by the
problem part (at most sqrt(q (1 - q) / 500), 2 points at q = 0.7, for one method; much less
for a paired difference, whose problem part mostly cancels). Where the paper gives no
per-seed values there is no sample: "no samples", never 0.

Mean: a t-interval over seeds (n - 1 df), kept in [0, 1] (`analysis.stats.bounded_interval`).
Paired difference: the differences seed by seed (the same seed for both methods), a
one-sample t-test on them (n - 1 df), its interval kept in [-1, 1], and the MDE of a design
with this many seeds at the observed spread (`analysis.stats.mde`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats as sps

from analysis.stats import bounded_interval, mde

NO_SAMPLES = "no samples"


@dataclass(frozen=True)
class SeedMean:
    """The mean over seeds and its t-interval (None when fewer than two seeds)."""

    n: int
    mean: float | None
    lo: float | None = None
    hi: float | None = None
    level: float = 0.95

    def text(self, digits: int = 4) -> str:
        """'95% CI 0.6463 to 0.6641', or why there is none."""
        if self.lo is None or self.hi is None:
            return f"{self.level:.0%} CI: " + (NO_SAMPLES if self.n == 0 else "one seed")
        return f"{self.level:.0%} CI {self.lo:.{digits}f} to {self.hi:.{digits}f}"


@dataclass(frozen=True)
class SeedDifference:
    """A - B paired by seed."""

    seeds: tuple[int, ...]           # the seeds both have
    estimate: float | None           # the mean paired difference
    lo: float | None = None
    hi: float | None = None
    p: float | None = None           # two-sided paired t-test
    mde: float | None = None         # at `power` and `alpha`, this many seeds, this spread
    level: float = 0.95

    @property
    def n(self) -> int:
        return len(self.seeds)

    def text(self, digits: int = 4) -> str:
        """'+0.0308, 95% CI +0.0234 to +0.0382, p 0.00031, MDE 0.0098 (5 seeds)', or why
        there is none."""
        if self.estimate is None:
            return NO_SAMPLES
        return f"{self.estimate:+.{digits}f}, {self.stats_text(digits)}"

    def stats_text(self, digits: int = 4) -> str:
        """The same without the estimate (shown next to it)."""
        if self.estimate is None:
            return NO_SAMPLES
        if self.lo is None or self.hi is None or self.p is None or self.mde is None:
            return "one seed: no interval"
        return (f"{self.level:.0%} CI {self.lo:+.{digits}f} to {self.hi:+.{digits}f}, "
                f"p {_p(self.p)}, MDE {self.mde:.{digits}f} ({self.n} seeds)")


def seed_mean(values: Sequence[float], *, level: float = 0.95) -> SeedMean:
    """The mean of per-seed values with its t-interval."""
    n = len(values)
    if n == 0:
        return SeedMean(0, None, level=level)
    mean = statistics.fmean(values)
    if n == 1:
        return SeedMean(1, mean, level=level)
    lo, hi = bounded_interval(mean, statistics.stdev(values) / math.sqrt(n), n - 1, level)
    return SeedMean(n, mean, lo, hi, level)


def paired_seed_difference(a: Mapping[int, float], b: Mapping[int, float], *,
                           level: float = 0.95, alpha: float = 0.05,
                           power: float = 0.8) -> SeedDifference:
    """A - B over the seeds both have (seed -> value); no common seed: no samples."""
    seeds = tuple(s for s in a if s in b)
    diffs = [a[s] - b[s] for s in seeds]
    if not diffs:
        return SeedDifference((), None, level=level)
    est = statistics.fmean(diffs)
    n = len(diffs)
    if n == 1:
        return SeedDifference(seeds, est, level=level)
    se = statistics.stdev(diffs) / math.sqrt(n)
    lo, hi = bounded_interval(est, se, n - 1, level, -1.0, 1.0)
    if se > 0:
        p = float(2 * sps.t.sf(abs(est) / se, n - 1))
    else:  # every seed the same difference
        p = 1.0 if est == 0 else 0.0
    return SeedDifference(seeds, est, lo, hi, p,
                          mde(se, n - 1, alpha=alpha, power=power), level)


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 0.0001 else "<0.0001"
