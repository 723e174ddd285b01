"""What a design can detect: the SE, degrees of freedom and minimum detectable effect of a
paired AVG difference (A - B) for given problem counts and seeds, before any data.

The model is the one `analysis.stats` estimates. For benchmark b, one run's score on one
problem has variance `problem_var[b]` (0/1 grades at accuracy q: q (1 - q)); A's and B's
scores on the same problem and seed have correlation `correlation[b]` (the shared
difficulty), so the paired difference varies by v_b = 2 problem_var (1 - correlation) per
problem and seed. A share `problem_share[b]` of v_b belongs to the problem (the same for
every seed: a problem one method solves and the other does not, whatever the seed); the rest
is seed x problem noise. Each method's AVG also moves from seed to seed by `seed_var` beyond
that noise (the seed effect; A's and B's independent, so the difference has twice it). Then

    problems = sum_b v_b problem_share_b / P_b / k^2             (k benchmarks)
    seeds    = (2 seed_var + sum_b v_b (1 - problem_share_b) / P_b / k^2) / S

the same two parts, with the same Satterthwaite degrees of freedom, as the test's, and the
MDE is `analysis.stats.mde` of that SE.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import stats as sps

from analysis.stats import AVG, Cell, Components, check_pair, components, difference_cell, mde


@dataclass(frozen=True)
class Design:
    """A paired comparison's design and the variances it meets (see the module's doc)."""

    n_problems: tuple[int, ...]          # per benchmark
    n_seeds: int
    problem_var: tuple[float, ...]       # of one score, per benchmark
    correlation: tuple[float, ...]       # of A's and B's scores on a problem and seed
    seed_var: float = 0.0                # of one method's AVG from seed to seed, beyond noise
    problem_share: tuple[float, ...] = ()  # per benchmark; () = 0 everywhere

    def __post_init__(self) -> None:
        n = len(self.n_problems)
        if len(self.problem_var) != n or len(self.correlation) != n or \
                len(self.problem_share) not in (0, n):
            raise ValueError("one problem_var, correlation (and problem_share) per benchmark")
        if self.n_seeds < 1 or min(self.n_problems) < 2:
            raise ValueError("a design needs a seed and two problems per benchmark")

    @staticmethod
    def uniform(n_benchmarks: int, n_problems: int, n_seeds: int, problem_var: float,
                correlation: float, seed_var: float = 0.0) -> Design:
        """The same problem count and variances on every benchmark."""
        k = n_benchmarks
        return Design((n_problems,) * k, n_seeds, (problem_var,) * k, (correlation,) * k,
                      seed_var)

    def with_seeds(self, n_seeds: int) -> Design:
        return replace(self, n_seeds=n_seeds)

    def components(self) -> Components:
        """The variance of the paired AVG difference in the test's two parts, with the
        spread of the problem part's mean squares as the test will estimate them."""
        k, s = len(self.n_problems), self.n_seeds
        shares = self.problem_share or (0.0,) * k
        problems = noise = spread = 0.0
        for v, r, share, p in zip(self.problem_var, self.correlation, shares, self.n_problems,
                                  strict=True):
            per_problem = 2 * v * (1 - r)           # of the difference, per problem and seed
            fixed, e = per_problem * share, per_problem * (1 - share)
            if s == 1:  # the problem part is all of it: var(c) / P
                problems += (fixed + e) / p / k ** 2
                spread += ((fixed + e) / p / k ** 2) ** 2 / (p - 1)
                continue
            problems += fixed / p / k ** 2
            noise += e / p / k ** 2
            spread += (((fixed + e / s) / p) ** 2 / (p - 1)
                       + (e / (s * p)) ** 2 / ((s - 1) * (p - 1))) / k ** 4
        if s == 1:  # nothing varies "from seed to seed": the seed effect is in the run
            return Components(problems + 2 * self.seed_var, 0.0, 0.0, spread, 1)
        return Components(problems, (2 * self.seed_var + noise) / s, noise / s, spread, s)


@dataclass(frozen=True)
class Plan:
    """What a design's paired AVG test can detect."""

    se: float
    df: float
    mde: float           # found with probability `power` by the two-sided level-alpha test
    alpha: float
    power: float

    def power_at(self, effect: float) -> float:
        """Probability that the test finds a true difference `effect` in its direction
        (noncentral t with the plan's df; normal when df is large)."""
        if self.se <= 0:
            return 1.0 if effect else self.alpha / 2
        ncp = abs(effect) / self.se
        if self.df > 1e4:
            return float(sps.norm.sf(sps.norm.ppf(1 - self.alpha / 2) - ncp))
        return float(sps.nct.sf(sps.t.ppf(1 - self.alpha / 2, self.df), self.df, ncp))


def plan(design: Design, *, alpha: float = 0.05, power: float = 0.8) -> Plan:
    """The SE, degrees of freedom and MDE of the paired AVG difference under `design`.
    (With one seed the seed effect is counted as noise of that one run: the test is then
    about the run, and the MDE is about the run's difference.)"""
    comp = design.components()
    return Plan(comp.se, comp.df, mde(comp.se, comp.df, alpha=alpha, power=power), alpha, power)


def design_of(a: Cell, b: Cell) -> Design:
    """The design of a paired comparison and the variances it shows (a pilot), to be fed to
    `plan` with other problem or seed counts (e.g. `design_of(a, b).with_seeds(5)`)."""
    n_seeds = check_pair(a, b)
    d = difference_cell(a, b)
    sizes, pvar, corr, share = [], [], [], []
    for name in a:
        x, y = (np.asarray(c[name], dtype=float).ravel() for c in (a, b))
        v = (x.var() + y.var()) / 2
        sizes.append(np.shape(a[name])[1])
        pvar.append(float(v))
        corr.append(float(np.mean((x - x.mean()) * (y - y.mean())) / v) if v > 0 else 0.0)
        share.append(_problem_share(np.asarray(d[name]), n_seeds))
    seed_var = 0.0
    if n_seeds > 1:  # the seed part beyond the noise it holds, per method (half the pair's)
        comp = components(d)[AVG]
        k = len(sizes)
        noise = sum(2 * v * (1 - r) * (1 - s) / p / k ** 2
                    for v, r, s, p in zip(pvar, corr, share, sizes, strict=True))
        seed_var = max(0.0, comp.seeds * n_seeds - noise) / 2
    return Design(tuple(sizes), n_seeds, tuple(pvar), tuple(corr), seed_var, tuple(share))


def design_record(design: Design) -> dict[str, Any]:
    """`design` as JSON-able values (analysis/reference/tiny/designs.json holds such records)."""
    return {"n_problems": list(design.n_problems), "n_seeds": design.n_seeds,
            "problem_var": list(design.problem_var), "correlation": list(design.correlation),
            "seed_var": design.seed_var, "problem_share": list(design.problem_share)}


def design_from_record(record: Mapping[str, Any]) -> Design:
    """The inverse of `design_record` (ValueError naming a missing or extra key)."""
    keys = {"n_problems", "n_seeds", "problem_var", "correlation", "seed_var", "problem_share"}
    if set(record) != keys:
        raise ValueError(f"a design record has exactly the keys {sorted(keys)}, got "
                         f"{sorted(record)}")
    return Design(tuple(int(p) for p in record["n_problems"]), int(record["n_seeds"]),
                  tuple(float(v) for v in record["problem_var"]),
                  tuple(float(r) for r in record["correlation"]), float(record["seed_var"]),
                  tuple(float(s) for s in record["problem_share"]))


def _problem_share(d: np.ndarray, n_seeds: int) -> float:
    """The share of the difference's per-problem variance that is the problem's own (seen
    in every seed): from the two-way table's mean squares; 0 with one seed (not estimable)."""
    if n_seeds < 2:
        return 0.0
    s, p = d.shape
    resid = d - d.mean(1, keepdims=True) - d.mean(0, keepdims=True) + d.mean()
    ms_e = float((resid ** 2).sum()) / ((s - 1) * (p - 1))
    fixed = max(0.0, float(d.mean(0).var(ddof=1)) - ms_e / s)
    return fixed / (fixed + ms_e) if fixed + ms_e > 0 else 0.0


def needed_seeds(design: Design, effect: float, *, alpha: float = 0.05, power: float = 0.8,
                 most: int = 64) -> int | None:
    """The fewest seeds whose design detects `effect` with `power` (None: not within `most`)."""
    for n in range(2, most + 1):
        if plan(design.with_seeds(n), alpha=alpha, power=power).mde <= abs(effect):
            return n
    return None

