"""How sure an accuracy is: estimates, intervals and paired differences over problems x seeds.

Pure numpy/scipy, no I/O. Built on it: `analysis.power` (the minimum detectable effect of a
design, before any data), `analysis.verdicts` (a claim's comparisons -> supported /
contradicted / inconclusive), `analysis.seed_stats` (Table 6: per-seed numbers only).

Data model
----------
A *cell* is one agent trained with one method: a mapping benchmark -> scores, a float array
``[n_seeds, n_problems_b]`` in [0, 1] (a problem's greedy 0/1 grade, or the mean of its k
sampled grades). Row s is training seed s, column p is problem p of benchmark b; all
benchmarks of a cell have the same rows, problem counts differ; n_seeds may be 1. Two cells
that are compared are *paired*: the same benchmarks, the same problems in the same order,
and row s of each is the same seed. AVG is the unweighted mean of the benchmark accuracies
(the paper's), seed by seed and then over seeds.

What the uncertainty is about
-----------------------------
The estimand is the accuracy a method reaches with a fresh training seed on the population
of problems a benchmark samples. Seeds and problems are *crossed* (every seed answers every
problem), so for one benchmark (two-way random effects: problem difficulty a_p, seed level
b_s, seed x problem noise e_sp, e.g. which problems a run happens to get right)

    Var(mean) = s2_a / P  +  (s2_b + s2_e / P) / S
                problems      seeds

by moments: the seed-averaged problem scores c_p vary by s2_a + s2_e / S and the residual
mean square MS_e of the seeds x problems table estimates s2_e, so problems = var(c) / P -
MS_e / (S P); the per-seed accuracies r_s vary by s2_b + s2_e / P, so seeds = var(r) / S.
AVG: the per-seed AVGs are the r_s, and the benchmarks' problem parts add up with weights
1 / n_benchmarks^2 (benchmarks sample their problems apart).

The seed x problem noise is counted in the seed part because 3 seeds cannot tell it from a
real seed effect s2_b. Counting it with the problems instead (MS_e pins it down with
thousands of df) treats a small estimate of s2_b as no seed effect: in simulation a 5% test
then rejected 8-11% of true nulls with seed effects of 0.4-1.6 points. So a verdict's
degrees of freedom come mostly from the seeds (about S - 1 for a paired difference of 0/1
scores): a gain must hold up from seed to seed, not only from problem to problem. With one
seed the problem part holds everything (var(c) / P), and the result is about that run.

The bootstrap
-------------
Plainly resampling the rows and columns of the score table (the "pigeonhole" bootstrap)
counts s2_e / (S P) once through the problems and again through the seeds, 1 + 2(S-1)/S
times in all: at 3 seeds a paired difference's SE comes out about 1.5 times too wide
(tests/test_stats.py shows it). Here each effect is resampled once and rescaled to its
moment estimate:
  * problems: one index vector per benchmark, drawn with replacement, applied to every seed
    (problems are shared by the seeds) and to both cells of a pair, resamples the
    seed-averaged scores c_p, scaled to variance `problems`;
  * seeds: one index vector, drawn with replacement and shared by every benchmark and both
    cells, resamples the per-seed accuracies r_s, scaled by sqrt(S / (S - 1)) to variance
    `seeds` (a resampled mean of S values varies by var(r, ddof=0) / S).
With one seed it is a plain problem bootstrap. For the linear statistics (a benchmark, AVG,
their differences) its SE reproduces the analytic one up to Monte Carlo error (tested); the
IQM's interval and the probability of improvement come from its replicates.

Intervals and p-values: p from the t statistic estimate / SE with df by Satterthwaite over
the problem part's two mean squares and the seeds' S - 1 (`Components.df`). The interval is
the t interval estimate +- t(df) * SE mid-range, made to respect the range of what it is
about (`bounded_interval`: Wilson's score interval with the effective sample size the SE
implies and the t quantile; an accuracy's lies in [0, 1], a difference's in [-1, 1]); the
IQM's percentile interval comes from replicates clipped to the range. Simulated at the tiny
design (3 seeds, 7 x 1200 problems; 7 x 300 for the variants), a 5% test of a paired AVG
difference rejects 3-5% of true nulls with and without seed effects and problem x method
effects, and its power is `analysis.power.plan`'s within 1.5 points; a cell's 95% interval
covers 94-95%, about 93% when the seed effect dominates the problems (2 df cannot pin it
down), and near 0 and 1 too (tests/test_stats.py prints the table).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy import stats as sps

Cell = Mapping[str, np.ndarray]  # benchmark -> scores [n_seeds, n_problems_b]
AVG, IQM = "AVG", "IQM"          # keys of the aggregates, next to the benchmarks' names
N_BOOT = 2000


@dataclass(frozen=True)
class Components:
    """Moment estimates of the variance of one accuracy (a benchmark's, or AVG)."""

    problems: float         # s2_a / P = var(c) / P - MS_e / (S P): unbiased, so < 0 by
                            # chance (with one seed var(c) / P: all of the variance)
    seeds: float            # var(r_s) / S: what varies from seed to seed (0 with one seed)
    noise: float            # MS_e / (S P): the seed x problem noise `seeds` holds at least
    problems_spread: float  # Satterthwaite's sum of term^2 / df over `problems`' two terms
    n_seeds: int

    @property
    def var(self) -> float:
        return max(0.0, self.problems) + self.seeds

    @property
    def se(self) -> float:
        return math.sqrt(self.var)

    @property
    def df(self) -> float:
        """Satterthwaite's degrees of freedom, the seed part counted at no less than the noise
        it must hold: with S - 1 = 2 df, seeds that agree by chance would otherwise pass for
        many degrees of freedom just when the SE is too small (in simulation a 5% test of 7-8.5%
        where a problem x method effect shares the variance with the seed noise)."""
        seeds = max(self.seeds, self.noise)
        spread = self.problems_spread
        if self.n_seeds > 1:
            spread += seeds ** 2 / (self.n_seeds - 1)
        return (max(0.0, self.problems) + seeds) ** 2 / spread if spread > 0 else math.inf


@dataclass(frozen=True)
class Estimate:
    """One cell's accuracy on a benchmark, AVG or IQM, with its interval (95% by default)."""

    name: str                    # benchmark, AVG or IQM
    estimate: float
    se: float                    # bootstrap standard error (analytic with n_boot=0)
    lo: float
    hi: float
    df: float                    # of the interval's t quantile (IQM: percentile interval, inf)
    se_analytic: float | None    # the moment SE (None for the IQM)
    n_seeds: int
    n_problems: int              # the benchmark's; all benchmarks' for AVG and IQM


@dataclass(frozen=True)
class Difference:
    """A - B of two paired cells on a benchmark, AVG or IQM."""

    name: str
    estimate: float
    se: float                    # bootstrap standard error (analytic with n_boot=0)
    lo: float
    hi: float
    df: float
    p: float | None              # two-sided, t(df) with `se`; None for the IQM
    prob_improvement: float | None  # share of bootstrap replicates with A > B (ties: half)
    se_analytic: float | None
    n_seeds: int
    n_problems: int
    alpha: float = 0.05          # the test's level and the power the MDE is for
    power: float = 0.8

    @property
    def mde(self) -> float | None:
        """Minimum detectable |A - B| of this design at `power` and `alpha` (None: IQM)."""
        return None if self.p is None else mde(self.se, self.df, alpha=self.alpha,
                                               power=self.power)


def check_cell(cell: Cell, *, signed: bool = False) -> int:
    """The cell's number of seeds; ValueError if it is not a cell as described above
    (`signed`: a difference of two cells, scores in [-1, 1])."""
    if not cell:
        raise ValueError("a cell needs at least one benchmark")
    low = -1 if signed else 0
    seeds = set()
    for name, y in cell.items():
        y = np.asarray(y)
        if y.ndim != 2 or y.shape[0] < 1 or y.shape[1] < 2:
            raise ValueError(f"{name}: scores must be [n_seeds >= 1, n_problems >= 2], got "
                             f"{y.shape}")
        if not np.all(np.isfinite(y)) or y.min() < low or y.max() > 1:
            raise ValueError(f"{name}: scores must be finite and in [{low}, 1]")
        seeds.add(y.shape[0])
    if len(seeds) > 1:
        raise ValueError(f"all benchmarks of a cell have the same seeds, got {sorted(seeds)}")
    return seeds.pop()


def check_pair(a: Cell, b: Cell) -> int:
    """The pair's number of seeds; ValueError unless a and b are paired (same shapes)."""
    check_cell(a)
    check_cell(b)
    if list(a) != list(b):
        raise ValueError(f"paired cells have the same benchmarks: {list(a)} vs {list(b)}")
    for name in a:
        if np.shape(a[name]) != np.shape(b[name]):
            raise ValueError(f"{name}: {np.shape(a[name])} vs {np.shape(b[name])} (paired cells "
                             "share seeds and problems)")
    return check_cell(a)


def _benchmark_components(y: np.ndarray) -> Components:
    s, p = y.shape
    spread = float(y.mean(0).var(ddof=1)) / p  # of the seed-averaged problem scores
    if s == 1:
        return Components(spread, 0.0, 0.0, spread ** 2 / (p - 1), 1)
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    noise = float((resid ** 2).sum()) / ((s - 1) * (p - 1)) / (s * p)  # MS_e / (S P)
    return Components(spread - noise, float(y.mean(1).var(ddof=1)) / s, noise,
                      spread ** 2 / (p - 1) + noise ** 2 / ((s - 1) * (p - 1)), s)


def _per_seed_avg(cell: Cell) -> np.ndarray:
    """AVG of each seed [n_seeds]: the mean of its benchmark accuracies."""
    return np.mean([np.asarray(y, dtype=float).mean(1) for y in cell.values()], axis=0)


def components(cell: Cell) -> dict[str, Components]:
    """The analytic variance of each benchmark's accuracy and of AVG (key `AVG`); the cell
    may be a difference of two (`difference_cell`)."""
    s = check_cell(cell, signed=True)
    out = {name: _benchmark_components(np.asarray(y, dtype=float)) for name, y in cell.items()}
    weight = 1 / len(cell) ** 2
    problems = sum(weight * c.problems for c in out.values())
    noise = sum(weight * c.noise for c in out.values())
    spread = sum(weight ** 2 * c.problems_spread for c in out.values())
    seeds = float(_per_seed_avg(cell).var(ddof=1)) / s if s > 1 else 0.0
    out[AVG] = Components(problems, seeds, noise, spread, s)
    return out


def _bootstrap(cells: Sequence[Cell], n_boot: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Replicates [n_boot] of every benchmark's accuracy and of AVG for each of the aligned
    `cells`, all from one draw of problems and seeds (what pairs them); the same `seed`
    draws the same indices for any cells of these shapes."""
    names = list(cells[0])
    n_seeds = check_cell(cells[0], signed=True)
    seed_idx = _draws(seed, len(names), len(names), n_seeds, n_boot)
    seed_scale = math.sqrt(n_seeds / (n_seeds - 1)) if n_seeds > 1 else 0.0
    out: list[dict[str, np.ndarray]] = [{} for _ in cells]
    for k, name in enumerate(names):
        ys = np.stack([np.asarray(c[name], dtype=float) for c in cells])  # [cells, S, P]
        cols, rows = ys.mean(1), ys.mean(2)                                # [cells, P], [cells, S]
        n_problems = cols.shape[1]
        counts = _draw_counts(seed, k, len(names), n_problems, n_boot)
        resampled = counts @ cols.T / n_problems                         # [n_boot, cells]
        for i, y in enumerate(ys):
            target = max(0.0, _benchmark_components(y).problems)  # the problem part's var
            raw = float(cols[i].var()) / n_problems         # what resampling c_p gives
            scale = math.sqrt(target / raw) if raw > 0 else 0.0
            problem_part = scale * (resampled[:, i] - cols[i].mean())
            seed_part = seed_scale * (rows[i][seed_idx].mean(1) - rows[i].mean())
            out[i][name] = y.mean() + problem_part + seed_part
    for reps in out:  # AVG is linear: the mean of the benchmarks' replicates
        reps[AVG] = np.mean([reps[n] for n in names], axis=0)
    return out


@functools.lru_cache(maxsize=4)
def _draws(seed: int, stream: int, streams: int, n: int, n_boot: int) -> np.ndarray:
    """[n_boot, n] indices drawn with replacement from range(n) by the `stream`-th of the
    `streams + 1` generators spawned from `seed` (read-only: shared by every call)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(streams + 1)[stream])
    out = rng.integers(0, n, size=(n_boot, n))
    out.flags.writeable = False
    return out


@functools.lru_cache(maxsize=16)
def _draw_counts(seed: int, stream: int, streams: int, n: int, n_boot: int) -> np.ndarray:
    """[n_boot, n] how often each of the n problems is drawn in each replicate by `_draws`.

    A report bootstraps every cell with the same seed, so the same draws recur for every
    benchmark of its size: counted once, each cell's replicate means are one matrix product
    (`counts @ values / n`, the mean of the drawn values up to rounding in the last bit),
    where drawing and gathering 2000 x 1300 values per cell and benchmark was 40% of a paper
    report's time.
    """
    draws = _draws(seed, stream, streams, n, n_boot)
    flat = (np.arange(n_boot)[:, None] * n + draws).ravel()
    out = np.bincount(flat, minlength=n_boot * n).reshape(n_boot, n).astype(float)
    out.flags.writeable = False
    return out


def _iqm(per_benchmark: np.ndarray) -> np.ndarray:
    """Interquartile mean over the last (benchmark) axis: scipy's 25% trimmed mean."""
    return np.asarray(sps.trim_mean(per_benchmark, 0.25, axis=-1))


def bounded_interval(est: float, se: float, df: float, level: float = 0.95,
                     low: float = 0.0, high: float = 1.0,
                     count: int | None = None) -> tuple[float, float]:
    """An interval for a mean that lies in [low, high] (an accuracy: [0, 1]; a difference of
    two: [-1, 1]), always inside that range.

    Wilson's score interval on q = (est - low) / (high - low), with the *effective* sample
    size n = q (1 - q) / SE_q^2 that the design's SE implies (Korn and Graubard's device for
    clustered proportions: here seeds x problems, the SE from `components` or the bootstrap)
    and the t(df) quantile in place of the normal's. Mid-range it is the t interval, est +-
    t * SE, to a fraction of the SE; towards an end it turns asymmetric, as the binomial
    does, instead of crossing it. All scores at an end (SE 0): Wilson's interval for 0 or
    `count` successes of `count` (the scores the mean is over); with no count, the point.
    """
    width = high - low
    q, se_q = (est - low) / width, se / width
    z = float(sps.t.ppf(0.5 + level / 2, df))
    if se_q > 0 and 0 < q < 1:
        n = q * (1 - q) / se_q ** 2
    elif count and (q <= 0 or q >= 1):
        n = float(count)
    else:
        return est, est
    q = min(1.0, max(0.0, q))
    center = (q + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(q * (1 - q) / n + z * z / (4 * n * n))
    return low + width * max(0.0, center - half), low + width * min(1.0, center + half)


def _point(cell: Cell, name: str) -> float:
    if name == AVG:
        return float(_per_seed_avg(cell).mean())
    return float(np.mean(np.asarray(cell[name], dtype=float)))  # float64, as the SE


def _rows(cell: Cell, n_seeds: int, reps: dict[str, np.ndarray], level: float, low: float
          ) -> Iterator[tuple[str, float, float, float, float, Components, int]]:
    """Per benchmark and AVG of `cell`: (name, estimate, SE, lo, hi, components, problems),
    the SE bootstrapped when `reps` has replicates (else analytic), the interval
    `bounded_interval` over [low, 1] with t(df) (low: 0 for a cell, -1 for a difference)."""
    sizes = {name: np.shape(y)[1] for name, y in cell.items()}
    for name, comp in components(cell).items():
        est = _point(cell, name)
        se = float(reps[name].std(ddof=1)) if reps else comp.se
        problems = sizes.get(name, sum(sizes.values()))
        lo, hi = bounded_interval(est, se, comp.df, level, low, 1.0, n_seeds * problems)
        yield name, est, se, lo, hi, comp, problems


def cell_estimates(cell: Cell, *, n_boot: int = N_BOOT, seed: int = 0,
                   level: float = 0.95) -> dict[str, Estimate]:
    """Every benchmark's accuracy, AVG and IQM of one cell, with bootstrap SE and interval.

    Benchmarks and AVG: estimate +- t(df) * bootstrap SE (df: `Components.df`). IQM: scipy's
    25% trimmed mean of the seed-averaged benchmark accuracies (the middle benchmarks; with
    benchmarks this far apart in difficulty a per-(seed, benchmark) IQM trims the same whole
    benchmarks, only less smoothly), with a percentile interval of its replicates.
    `n_boot=0`: no bootstrap (fast, for simulations): the analytic SE, no IQM.
    """
    n_seeds = check_cell(cell)
    reps = _bootstrap([cell], n_boot, seed)[0] if n_boot else {}
    sizes = {name: np.shape(y)[1] for name, y in cell.items()}
    out = {name: Estimate(name, est, se, lo, hi, comp.df, comp.se, n_seeds, problems)
           for name, est, se, lo, hi, comp, problems in _rows(cell, n_seeds, reps, level, 0.0)}
    if reps:
        # replicates may step past an end (a resampled part added to the mean): clipped,
        # which moves no percentile that lies inside [0, 1]
        iqm_reps = np.clip(_iqm(np.stack([reps[n] for n in cell], axis=1)), 0.0, 1.0)
        lo, hi = np.quantile(iqm_reps, [0.5 - level / 2, 0.5 + level / 2])
        est = float(_iqm(np.array([np.mean(y) for y in cell.values()])))
        out[IQM] = Estimate(IQM, est, float(iqm_reps.std(ddof=1)), float(lo), float(hi),
                            math.inf, None, n_seeds, sum(sizes.values()))
    return out


def difference_cell(a: Cell, b: Cell) -> dict[str, np.ndarray]:
    """A - B problem by problem: scores in [-1, 1] with the cells' shapes."""
    check_pair(a, b)
    return {name: np.asarray(a[name], dtype=float) - np.asarray(b[name], dtype=float)
            for name in a}


def mean_cell(cells: Sequence[Cell]) -> dict[str, np.ndarray]:
    """The problem-by-problem mean of aligned cells, e.g. of every agent of a claim: their
    mean difference is then one paired difference, resampled jointly (the agents answer the
    same problems, and their seeds are paired too)."""
    if not cells:
        raise ValueError("mean_cell needs at least one cell")
    for c in cells[1:]:
        check_pair(cells[0], c)
    return {name: np.mean([np.asarray(c[name], dtype=float) for c in cells], axis=0)
            for name in cells[0]}


def mde(se: float, df: float = math.inf, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable effect of the two-sided level-`alpha` t test with standard error
    `se` and `df` degrees of freedom: the effect it finds with probability `power`.
    (z_{1-alpha/2} + z_{power}) * se for large df; for few df the noncentral t's exact value
    (the t-quantile sum understates it: 5.65 SE, not 5.36, at 2 df). `power` must lie in
    (alpha / 2, 1): a test finds any effect, even none, with probability alpha / 2 or more."""
    if not alpha / 2 < power < 1:
        raise ValueError(f"mde: power {power} must lie in (alpha / 2, 1) = ({alpha / 2:g}, 1)")
    if df > 1e4:
        return float((sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)) * se)
    crit = float(sps.t.ppf(1 - alpha / 2, df))

    def short(ncp: float) -> float:  # the far tail (an effect found with the wrong sign) is nil
        return float(sps.nct.sf(crit, df, ncp)) - power

    top = 2 * crit + 10
    while short(top) < 0:
        top *= 2
    return float(optimize.brentq(short, 0.0, top)) * se


def _p_value(est: float, se: float, df: float) -> float:
    if se <= 0:
        return 1.0 if est == 0 else 0.0
    return float(2 * sps.t.sf(abs(est) / se, df))


def _improvement(replicates: np.ndarray) -> float:
    return float(np.mean(replicates > 0) + 0.5 * np.mean(replicates == 0))


def paired_difference(a: Cell, b: Cell, *, n_boot: int = N_BOOT, seed: int = 0,
                      level: float = 0.95, alpha: float = 0.05,
                      power: float = 0.8) -> dict[str, Difference]:
    """A - B on every benchmark, AVG and IQM, the same problems and seeds resampled for both.

    Benchmarks and AVG: the problem-by-problem difference A - B analysed as a cell (scores in
    [-1, 1]): bootstrap SE, interval estimate +- t(df) * SE, two-sided p from t(df) (a Wald
    test with the bootstrap SE; a sign-flip test would need exchangeable runs, and 3 seeds
    give 8 flips, a smallest p of 0.25), MDE (on access) at `power` and `alpha`. IQM: IQM(A) - IQM(B) on
    the same replicates, percentile interval, no p (the verdicts test AVG).
    prob_improvement: the share of bootstrap replicates in which A beats B, i.e. how sure
    this design is of the sign (with few seeds the bootstrap sees only those seeds, so it is
    descriptive; verdicts use p). Not rliable's P(X > Y), which compares single runs: with 3
    seeds a ratio of 9 pairs that ignores the problems.
    `n_boot=0`: no bootstrap (fast, for simulations): the analytic SE, no prob_improvement,
    no IQM.
    """
    d = difference_cell(a, b)
    n_seeds = check_cell(d, signed=True)
    reps_a, reps_b, reps_d = _bootstrap([a, b, d], n_boot, seed) if n_boot else ({}, {}, {})
    sizes = {name: np.shape(y)[1] for name, y in d.items()}
    out = {name: Difference(name, est, se, lo, hi, comp.df, _p_value(est, se, comp.df),
                            _improvement(reps_d[name]) if reps_d else None, comp.se, n_seeds,
                            problems, alpha, power)
           for name, est, se, lo, hi, comp, problems in _rows(d, n_seeds, reps_d, level, -1.0)}
    if reps_d:
        iqm_reps = np.clip(np.clip(_iqm(np.stack([reps_a[n] for n in d], axis=1)), 0.0, 1.0)
                           - np.clip(_iqm(np.stack([reps_b[n] for n in d], axis=1)), 0.0, 1.0),
                           -1.0, 1.0)
        est = float(_iqm(np.array([np.mean(a[n]) for n in d]))
                    - _iqm(np.array([np.mean(b[n]) for n in d])))
        lo, hi = np.quantile(iqm_reps, [0.5 - level / 2, 0.5 + level / 2])
        out[IQM] = Difference(IQM, est, float(iqm_reps.std(ddof=1)), float(lo), float(hi),
                              math.inf, None, _improvement(iqm_reps), None, n_seeds,
                              sum(sizes.values()), alpha, power)
    return out
