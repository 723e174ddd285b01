"""analysis.stats pinned to exact numbers: each result recomputed here from the module
docstring's formulas (two-way ANOVA sums of squares, numpy's generators, scipy's t, noncentral
t and trimmed mean), never taken from the function under test.

The bootstrap is deterministic given its seed: the replicates are rebuilt here from
`SeedSequence(seed).spawn(n_benchmarks + 1)` (one problem stream per benchmark, the last for
the seeds), so the SEs, intervals, p-values and probabilities of improvement are checked to
rounding, not to Monte Carlo error; one test checks the Monte Carlo error itself.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as sps

from analysis import stats as st

Scores = Mapping[str, np.ndarray]
EXACT = 1e-12  # rounding: the module's matrix products vs the gathers here


def _grades(seed: int, seeds: int, problems: tuple[int, ...]) -> dict[str, np.ndarray]:
    """A cell of k = 4 sampled grades per problem: scores in {0, 1/4, ..., 1}."""
    rng = np.random.default_rng(seed)
    return {f"b{k}": rng.integers(0, 5, size=(seeds, p)) / 4 for k, p in enumerate(problems)}


SIZES = (5, 6, 4, 7)              # four benchmarks: the IQM trims one at each end
A = _grades(20, 3, SIZES)
B = _grades(21, 3, SIZES)
D = {n: A[n] - B[n] for n in A}  # the difference cell, scores in [-1, 1]

# the worked example: 2 seeds x 4 problems
# c = [1/2, 0, 1, 1/2], var(c) = 1/6 -> 1/24 per mean; r = [3/4, 1/4], var(r) = 1/8 -> seeds 1/16
# residuals +-1/4 everywhere: SS_e = 1/2, MS_e = 1/6 on 3 df -> noise 1/48; problems 1/24 - 1/48
HAND = np.array([[1.0, 0.0, 1.0, 1.0],
                 [0.0, 0.0, 1.0, 0.0]])


# -- independent references ------------------------------------------------------------------

def _anova(y: np.ndarray) -> tuple[float, float, float, float, int]:
    """(problems, seeds, noise, problems_spread, n_seeds) of one benchmark from the two-way
    table's sums of squares (the docstring's moments)."""
    y = np.asarray(y, dtype=float)
    s, p = y.shape
    grand = y.mean()
    ss_cols = s * float(((y.mean(0) - grand) ** 2).sum())
    between = ss_cols / (p - 1) / (s * p)            # MS_problems / (S P) = var(c) / P
    if s == 1:
        return between, 0.0, 0.0, between ** 2 / (p - 1), 1
    ss_rows = p * float(((y.mean(1) - grand) ** 2).sum())
    ss_error = float(((y - grand) ** 2).sum()) - ss_rows - ss_cols
    noise = ss_error / ((s - 1) * (p - 1)) / (s * p)  # MS_e / (S P)
    seeds = ss_rows / p / (s - 1) / s                   # var(r) / S
    spread = between ** 2 / (p - 1) + noise ** 2 / ((s - 1) * (p - 1))
    return between - noise, seeds, noise, spread, s


def _components(cell: Scores) -> dict[str, tuple[float, float, float, float, int]]:
    out = {n: _anova(y) for n, y in cell.items()}
    k = len(cell)
    s = next(iter(out.values()))[4]
    per_seed = sum(np.asarray(y, dtype=float).mean(1) for y in cell.values()) / k
    seeds = float(np.var(per_seed, ddof=1)) / s if s > 1 else 0.0
    out[st.AVG] = (sum(c[0] for c in out.values()) / k ** 2, seeds,
                   sum(c[2] for c in out.values()) / k ** 2,
                   sum(c[3] for c in out.values()) / k ** 4, s)
    return out


def _se(c: tuple[float, float, float, float, int]) -> float:
    return math.sqrt(max(c[0], 0.0) + c[1])


def _df(c: tuple[float, float, float, float, int]) -> float:
    problems, seeds, noise, spread, s = c
    held = max(seeds, noise)
    total = spread + (held ** 2 / (s - 1) if s > 1 else 0.0)
    return (max(problems, 0.0) + held) ** 2 / total if total > 0 else math.inf


def _replicates(cell: Scores, n_boot: int, seed: int) -> dict[str, np.ndarray]:
    """The bootstrap as the docstring describes it, by gathering the drawn values."""
    names = list(cell)
    children = np.random.SeedSequence(seed).spawn(len(names) + 1)
    s = np.shape(cell[names[0]])[0]
    seed_draws = np.random.default_rng(children[len(names)]).integers(0, s, size=(n_boot, s))
    out = {}
    for k, name in enumerate(names):
        y = np.asarray(cell[name], dtype=float)
        p = y.shape[1]
        picks = np.random.default_rng(children[k]).integers(0, p, size=(n_boot, p))
        c, r = y.mean(0), y.mean(1)
        plain = c[picks].mean(1) - c.mean()   # variance var(c, ddof=0) / P on average
        raw = float(np.var(c)) / p
        problem_part = plain * math.sqrt(max(_anova(y)[0], 0.0) / raw) if raw > 0 else 0 * plain
        seed_part = (r[seed_draws].mean(1) - r.mean()) * (math.sqrt(s / (s - 1)) if s > 1 else 0)
        out[name] = y.mean() + problem_part + seed_part
    out[st.AVG] = sum(out[n] for n in names) / len(names)
    return out


def _trim(x: np.ndarray) -> np.ndarray:
    """The IQM over the last axis: sort, drop floor(n / 4) at each end, average the rest."""
    x = np.sort(np.asarray(x, dtype=float), axis=-1)
    cut = x.shape[-1] // 4
    return np.asarray(x[..., cut:x.shape[-1] - cut].mean(-1))


def _t(est: float, se: float, df: float, level: float) -> tuple[float, float]:
    lo, hi = sps.t.interval(level, df, loc=est, scale=se) if se > 0 else (est, est)
    return float(lo), float(hi)


def _bounded(est: float, se: float, df: float, level: float, low: float,
             count: int) -> tuple[float, float]:
    """The interval `analysis.stats.bounded_interval` should give, written out: Wilson's
    interval for q = (est - low) / (1 - low) at n = q (1 - q) / (SE / (1 - low))^2 (or `count`
    with q at an end and no spread; the point with no spread mid-range), t quantile."""
    width = 1.0 - low
    q, s = (est - low) / width, se / width
    z = float(sps.t.ppf(0.5 + level / 2, df))
    if s > 0 and 0 < q < 1:
        n = q * (1 - q) / s ** 2
    elif q <= 0 or q >= 1:
        n = float(count)
    else:
        return est, est
    c = (q + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(q * (1 - q) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return low + width * max(0.0, c - h), low + width * min(1.0, c + h)


def _mde(se: float, df: float, alpha: float, power: float) -> float:
    if math.isinf(df):
        return float(sps.norm.isf(alpha / 2) - sps.norm.isf(power)) * se
    crit = float(sps.t.isf(alpha / 2, df))
    ncp = optimize.brentq(lambda d: float(sps.nct.sf(crit, df, d)) - power, 0.0, 200.0,
                          xtol=1e-14, rtol=1e-15)
    return float(ncp) * se


def _assert_replicates(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray],
                       n_boot: int) -> None:
    assert list(got) == list(want)
    for name in want:
        assert got[name].shape == (n_boot,), name
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=EXACT, err_msg=name)


def _raises(fn: Callable[..., Any], message: str, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    assert str(info.value) == message


# -- the data model: check_cell / check_pair --------------------------------------------------

def test_check_cell_returns_the_number_of_seeds_from_the_smallest_valid_shape_up() -> None:
    assert st.check_cell({"x": np.zeros((1, 2))}) == 1
    assert st.check_cell({"x": np.ones((4, 2)), "y": np.zeros((4, 9))}) == 4
    assert st.check_cell({"x": np.array([[0.0, 1.0], [1.0, 0.5]])}) == 2
    edges = np.array([[0.0, 1.0, 0.5]])                         # 0 and 1 themselves are scores
    assert st.check_cell({"x": edges}) == 1
    assert st.check_cell({"x": edges - 1}, signed=True) == 1    # -1 is a signed score


def test_check_cell_rejects_an_empty_cell() -> None:
    _raises(st.check_cell, "a cell needs at least one benchmark", {})
    _raises(st.check_cell, "a cell needs at least one benchmark", {}, signed=True)


@pytest.mark.parametrize("shape", [(5,), (0, 5), (3, 1), (1, 1), (2, 3, 4), (1, 0)])
def test_check_cell_rejects_shapes_other_than_seeds_by_problems(shape: tuple[int, ...]) -> None:
    _raises(st.check_cell, f"q: scores must be [n_seeds >= 1, n_problems >= 2], got {shape}",
            {"ok": np.zeros((2, 3)), "q": np.zeros(shape)})


@pytest.mark.parametrize("bad", [-0.25, -1e-9, 1 + 1e-9, 1.5, 2.5, math.nan, math.inf, -math.inf])
def test_check_cell_rejects_scores_outside_0_1(bad: float) -> None:
    y = np.full((2, 3), 0.5)
    y[1, 2] = bad
    _raises(st.check_cell, "z: scores must be finite and in [0, 1]", {"z": y})


@pytest.mark.parametrize("bad", [-1.25, -1 - 1e-9, 1 + 1e-9, 1.5, math.nan, math.inf])
def test_check_cell_signed_rejects_scores_outside_minus1_1(bad: float) -> None:
    y = np.full((2, 3), -0.5)
    y[0, 1] = bad
    _raises(st.check_cell, "z: scores must be finite and in [-1, 1]", {"z": y}, signed=True)


def test_check_cell_is_unsigned_by_default() -> None:
    y = {"z": np.array([[-0.5, 0.5]])}
    _raises(st.check_cell, "z: scores must be finite and in [0, 1]", y)
    _raises(st.check_cell, "z: scores must be finite and in [0, 1]", y, signed=False)
    assert st.check_cell(y, signed=True) == 1


def test_check_cell_wants_the_same_seeds_in_every_benchmark() -> None:
    _raises(st.check_cell, "all benchmarks of a cell have the same seeds, got [2, 3]",
            {"a": np.zeros((3, 5)), "b": np.zeros((2, 5))})
    _raises(st.check_cell, "all benchmarks of a cell have the same seeds, got [1, 2, 3]",
            {"a": np.zeros((3, 5)), "b": np.zeros((2, 5)), "c": np.zeros((1, 5))})
    # the problem counts may differ (seeds are rows, not columns)
    assert st.check_cell({"a": np.zeros((2, 5)), "b": np.zeros((2, 3))}) == 2


def test_check_pair_returns_the_seeds_of_a_paired_couple() -> None:
    a = {"a": np.zeros((3, 5)), "b": np.ones((3, 7))}
    b = {"a": np.ones((3, 5)), "b": np.zeros((3, 7))}
    assert st.check_pair(a, b) == 3 and st.check_pair(b, a) == 3
    assert st.check_pair({"a": np.zeros((1, 2))}, {"a": np.ones((1, 2))}) == 1


def test_check_pair_checks_both_cells_as_unsigned() -> None:
    good = {"a": np.zeros((2, 3))}
    _raises(st.check_pair, "a: scores must be finite and in [0, 1]", {"a": np.full((2, 3), 1.5)},
            good)
    _raises(st.check_pair, "a: scores must be finite and in [0, 1]", good,
            {"a": np.full((2, 3), -0.5)})
    _raises(st.check_pair, "a cell needs at least one benchmark", good, {})
    _raises(st.check_pair, "a cell needs at least one benchmark", {}, good)


def test_check_pair_wants_the_same_benchmarks_in_the_same_order() -> None:
    good = {"a": np.zeros((3, 5)), "b": np.ones((3, 7))}
    _raises(st.check_pair, "paired cells have the same benchmarks: ['a', 'b'] vs ['b', 'a']",
            good, {"b": np.ones((3, 7)), "a": np.zeros((3, 5))})
    _raises(st.check_pair, "paired cells have the same benchmarks: ['a', 'b'] vs ['a']",
            good, {"a": np.zeros((3, 5))})


def test_check_pair_wants_the_same_seeds_and_problems() -> None:
    good = {"a": np.zeros((3, 5)), "b": np.ones((3, 7))}
    _raises(st.check_pair, "b: (3, 7) vs (3, 6) (paired cells share seeds and problems)",
            good, {"a": np.zeros((3, 5)), "b": np.ones((3, 6))})
    _raises(st.check_pair, "a: (3, 5) vs (2, 5) (paired cells share seeds and problems)",
            good, {"a": np.zeros((2, 5)), "b": np.ones((2, 7))})


# -- Components: var, se, df --------------------------------------------------------------------

def test_components_var_and_se_add_the_problem_and_seed_parts() -> None:
    c = st.Components(0.03, 0.02, 0.5, 1.0, 3)
    assert c.var == pytest.approx(0.05, rel=EXACT) and c.se == pytest.approx(math.sqrt(0.05))
    negative = st.Components(-0.01, 0.02, 0.5, 1.0, 3)   # a chance-negative problem part: 0
    assert negative.var == pytest.approx(0.02, rel=EXACT)
    assert negative.se == pytest.approx(math.sqrt(0.02), rel=EXACT)
    assert st.Components(-0.01, 0.0, 0.0, 1.0, 1).var == 0.0


def test_components_df_counts_the_seed_part_at_no_less_than_the_noise() -> None:
    # noise 0.002 > seeds 0.001: (0.004 + 0.002)^2 / (1e-6 + 0.002^2 / 2) = 12
    assert st.Components(0.004, 0.001, 0.002, 1e-6, 3).df == pytest.approx(12.0, rel=EXACT)
    # seeds 0.002 > noise 0.001: (0.004 + 0.002)^2 / (2e-6 + 0.002^2 / 4) = 36e-6 / 3e-6
    assert st.Components(0.004, 0.002, 0.001, 2e-6, 5).df == pytest.approx(12.0, rel=EXACT)
    # two seeds: one df for the seed part; (0.001 + 0.003)^2 / (0 + 0.003^2 / 1)
    assert st.Components(0.001, 0.003, 0.0, 0.0, 2).df == pytest.approx(16 / 9, rel=EXACT)
    # a negative problem part counts as 0: 0.002^2 / (1e-6 + 0.002^2 / 2) = 4 / 3
    assert st.Components(-0.004, 0.002, 0.0, 1e-6, 3).df == pytest.approx(4 / 3, rel=EXACT)


def test_components_df_of_one_seed_is_the_problems_alone() -> None:
    # (1/16)^2 / (1/768): 3 = P - 1, whatever `seeds` holds (no seed df with one seed)
    assert st.Components(1 / 16, 0.0, 0.0, 1 / 768, 1).df == pytest.approx(3.0, rel=EXACT)
    assert st.Components(1 / 16, 0.5, 0.0, 1 / 768, 1).df == pytest.approx(
        (1 / 16 + 0.5) ** 2 * 768, rel=EXACT)


def test_components_df_is_infinite_without_any_spread() -> None:
    assert st.Components(0.0, 0.0, 0.0, 0.0, 3).df == math.inf
    assert st.Components(0.0, 0.0, 0.0, 0.0, 1).df == math.inf
    assert st.Components(0.5, 0.0, 0.0, 0.0, 1).df == math.inf
    # a tiny spread is not none
    assert st.Components(0.01, 0.0, 0.0, 1e-8, 1).df == pytest.approx(1e4, rel=EXACT)


def test_components_of_the_worked_example() -> None:
    c = st.components({"x": HAND})
    x = c["x"]
    assert x.problems == pytest.approx(1 / 48, rel=EXACT)
    assert x.seeds == pytest.approx(1 / 16, rel=EXACT)
    assert x.noise == pytest.approx(1 / 48, rel=EXACT)
    assert x.problems_spread == pytest.approx(5 / 6912, rel=EXACT)   # (1/24)^2/3 + (1/48)^2/3
    assert x.n_seeds == 2
    assert x.var == pytest.approx(1 / 12, rel=EXACT)
    assert x.df == pytest.approx(1.5, rel=EXACT)  # (1/12)^2 / (5/6912 + (1/16)^2 / 1)
    # one benchmark: AVG is it
    assert dataclasses.astuple(c[st.AVG]) == pytest.approx(dataclasses.astuple(x), rel=EXACT)
    assert list(c) == ["x", st.AVG]


def test_components_of_one_seed_are_the_problems_alone() -> None:
    one = st.components({"x": HAND[:1]})["x"]   # [1, 0, 1, 1]: var(c) = 1/4
    assert dataclasses.astuple(one) == pytest.approx((1 / 16, 0.0, 0.0, 1 / 768, 1), rel=EXACT)
    assert one.df == pytest.approx(3.0, rel=EXACT)
    avg = st.components({"x": HAND[:1], "y": np.array([[0.0, 0.5, 1.0]])})[st.AVG]
    assert avg.seeds == 0.0 and avg.noise == 0.0 and avg.n_seeds == 1
    # y: c = [0, 1/2, 1], var(c) = 1/4 -> 1/12 per mean; AVG: (1/16 + 1/12) / 4
    assert avg.problems == pytest.approx((1 / 16 + 1 / 12) / 4, rel=EXACT)
    assert avg.problems_spread == pytest.approx((1 / 768 + (1 / 12) ** 2 / 2) / 16, rel=EXACT)


def test_components_match_the_two_way_anova_for_every_benchmark_and_avg() -> None:
    for cell in (A, B, D, _grades(3, 2, (3, 8, 2)), _grades(4, 5, (9, 4, 6, 2, 3))):
        found = st.components(cell)
        assert list(found) == [*cell, st.AVG]
        for name, want in _components(cell).items():
            got = found[name]
            assert dataclasses.astuple(got) == pytest.approx(want, rel=1e-10, abs=1e-15), name
            assert got.se == pytest.approx(_se(want), rel=1e-10), name
            assert got.df == pytest.approx(_df(want), rel=1e-10), name


def test_components_accept_a_difference_cell() -> None:
    assert D["b0"].min() < 0  # the difference cell has negative scores
    assert st.components(D)[st.AVG].n_seeds == 3


def test_avg_components_weigh_benchmarks_by_one_over_k_squared() -> None:
    # three benchmarks with known parts: AVG's problem part is their sum / 9
    cell = {"a": HAND, "b": HAND[::-1], "c": HAND[:, ::-1]}
    avg = st.components(cell)[st.AVG]
    assert avg.problems == pytest.approx(3 / 48 / 9, rel=EXACT)
    assert avg.noise == pytest.approx(3 / 48 / 9, rel=EXACT)
    assert avg.problems_spread == pytest.approx(3 * 5 / 6912 / 81, rel=EXACT)
    # per-seed AVGs: [(3/4 + 1/4 + 3/4) / 3, (1/4 + 3/4 + 1/4) / 3] = [7/12, 5/12]
    assert avg.seeds == pytest.approx(np.var([7 / 12, 5 / 12], ddof=1) / 2, rel=EXACT)


def test_single_precision_scores_are_analysed_in_double() -> None:
    """Scores k/4 are exact in float32, but their means over 5 or 7 problems are not: every
    variance and replicate is computed in float64, as for the float64 cell."""
    a32 = {n: y.astype(np.float32) for n, y in A.items()}
    found = st.components(a32)
    for name, want in _components(A).items():
        assert dataclasses.astuple(found[name]) == pytest.approx(want, rel=1e-12, abs=1e-18), name
    (reps,) = st._bootstrap([a32], 60, 4)
    _assert_replicates(reps, _replicates(A, 60, 4), 60)
    thirds = st.mean_cell([{"x": np.zeros((1, 2), np.float32)}, {"x": np.ones((1, 2), np.float32)},
                           {"x": np.ones((1, 2), np.float32)}])
    assert thirds["x"].dtype == np.float64 and thirds["x"].tolist() == [[2 / 3, 2 / 3]]


# -- the bootstrap's draws ------------------------------------------------------------------------

def test_draws_are_the_streams_generator_integers() -> None:
    got = st._draws(5, 1, 3, 6, 40)
    want = np.random.default_rng(np.random.SeedSequence(5).spawn(4)[1]).integers(0, 6, (40, 6))
    assert got.shape == (40, 6) and np.array_equal(got, want)
    assert got.min() == 0 and got.max() == 5   # the whole range(n), nothing outside
    assert not got.flags.writeable
    with pytest.raises(ValueError):
        got[0, 0] = 1


def test_draws_depend_on_seed_and_stream_only_through_the_generator() -> None:
    base = st._draws(2, 0, 2, 5, 30)
    assert np.array_equal(base, st._draws(2, 0, 2, 5, 30))
    assert not np.array_equal(base, st._draws(3, 0, 2, 5, 30))   # another seed
    assert not np.array_equal(base, st._draws(2, 1, 2, 5, 30))   # another stream
    assert np.array_equal(base, st._draws(2, 0, 2, 5, 31)[:30])  # n_boot: more of the same
    assert st._draws(2, 2, 2, 5, 30).shape == (30, 5)            # streams + 1 generators
    with pytest.raises(IndexError):
        st._draws(2, 3, 2, 5, 30)


def test_draw_counts_count_each_problem_in_each_replicate() -> None:
    draws = np.random.default_rng(np.random.SeedSequence(8).spawn(3)[2]).integers(0, 9, (25, 9))
    want = np.stack([np.bincount(row, minlength=9) for row in draws]).astype(float)
    got = st._draw_counts(8, 2, 2, 9, 25)
    assert got.shape == (25, 9) and got.dtype == np.float64
    assert np.array_equal(got, want)
    assert np.array_equal(got.sum(1), np.full(25, 9.0))
    assert not got.flags.writeable
    assert not np.array_equal(got, st._draw_counts(8, 1, 2, 9, 25))
    assert not np.array_equal(got, st._draw_counts(9, 2, 2, 9, 25))


def test_draw_counts_keep_every_problem_column() -> None:
    # two problems, one replicate: often the last problem is never drawn, its column stays
    for seed in range(6):
        got = st._draw_counts(seed, 0, 0, 2, 1)
        draws = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0]).integers(0, 2,
                                                                                         (1, 2))
        assert got.shape == (1, 2)
        assert got.tolist() == [[float(np.sum(draws == 0)), float(np.sum(draws == 1))]]


# -- the bootstrap ----------------------------------------------------------------------------

def test_bootstrap_replicates_are_the_documented_resampling() -> None:
    for cell, n_boot, seed in ((A, 200, 0), (A, 150, 11), (_grades(5, 2, (6, 3)), 100, 4),
                               (_grades(6, 1, (8, 5, 4)), 120, 2),
                               (_grades(7, 5, (4, 4)), 90, 1)):
        (got,) = st._bootstrap([cell], n_boot, seed)
        _assert_replicates(got, _replicates(cell, n_boot, seed), n_boot)


def test_bootstrap_pairs_the_cells_through_one_draw() -> None:
    got = st._bootstrap([A, B, D], 200, 3)
    assert len(got) == 3
    for reps, cell in zip(got, (A, B, D), strict=True):
        _assert_replicates(reps, _replicates(cell, 200, 3), 200)


def test_bootstrap_takes_a_difference_cell_first() -> None:
    (got,) = st._bootstrap([D], 80, 6)
    _assert_replicates(got, _replicates(D, 80, 6), 80)


def test_bootstrap_seed_changes_the_replicates_not_their_centre() -> None:
    one, = st._bootstrap([A], 200, 0)
    two, = st._bootstrap([A], 200, 1)
    for name in one:
        assert not np.allclose(one[name], two[name]), name
    again, = st._bootstrap([A], 200, 0)
    _assert_replicates(again, one, 200)


def test_bootstrap_of_a_constant_cell_is_constant() -> None:
    flat = {"x": np.full((3, 5), 0.3), "y": np.full((3, 4), 0.7)}
    reps, = st._bootstrap([flat], 50, 0)
    assert np.all(reps["x"] == np.mean(flat["x"])) and np.all(reps["y"] == np.mean(flat["y"]))
    # seeds that differ on every problem alike: no problem variance, only the seeds'
    rows = {"x": np.repeat([[0.25], [0.5], [1.0]], 4, axis=1)}
    reps, = st._bootstrap([rows], 60, 2)
    _assert_replicates(reps, _replicates(rows, 60, 2), 60)
    assert len(set(np.round(reps["x"], 12))) > 1


def test_bootstrap_of_problems_without_spread_adds_no_rounding_noise() -> None:
    """0.1 is not dyadic: a replicate's mean of drawn problems (3 x 0.1 + 0.1) / 4 is not 0.1
    to the last bit; problems without spread get no problem part at all, so no such crumbs."""
    for cell in ({"x": np.full((1, 4), 0.1)}, {"x": np.full((1, 8), 0.1), "y": np.ones((1, 2))}):
        reps, = st._bootstrap([cell], 100, 0)
        assert np.all(reps["x"] == 0.1)
        e = st.cell_estimates(cell, n_boot=100)["x"]  # (std of 100 x 0.1 is itself a crumb)
        assert e.se == pytest.approx(0.0, abs=1e-15) and e.df == math.inf


def test_bootstrap_se_is_the_analytic_se_up_to_monte_carlo_error() -> None:
    """One seed, 400 problems: the replicates are a rescaled plain problem bootstrap whose
    variance is the analytic one in expectation; an SD from n replicates of a near-normal
    statistic is off by about 1 / sqrt(2 (n - 1)): allow 4 of those."""
    rng = np.random.default_rng(30)
    cell = {"x": (rng.random((1, 400)) < rng.beta(0.5, 0.5, 400)).astype(float)}
    n_boot = 2000
    est = st.cell_estimates(cell, n_boot=n_boot, seed=1)["x"]
    assert est.se_analytic == pytest.approx(math.sqrt(np.var(cell["x"], ddof=1) / 400), rel=1e-12)
    assert est.se == pytest.approx(est.se_analytic, rel=4 / math.sqrt(2 * (n_boot - 1)))


# -- small pieces: IQM, t interval, p-value, improvement -------------------------------------------

def test_iqm_trims_a_quarter_at_each_end() -> None:
    assert float(st._iqm(np.array([1.0, 2.0, 3.0, 10.0]))) == 2.5      # n 4: one each end
    assert float(st._iqm(np.array([0.0, 0.0, 9.0]))) == 3.0            # n 3: none
    assert float(st._iqm(np.array([100.0, 0, 1, 2, 3, 4, 5]))) == 3.0  # n 7: one each end
    assert float(st._iqm(np.array([0.0, 1, 2, 3, 4, 5, 6, 100]))) == 3.5  # n 8: two each end
    assert float(st._iqm(np.array([1.0, 5.0, 1.0, 1.0]))) == 1.0        # ties: the middle two
    assert float(st._iqm(np.array([7.0, 9.0]))) == 8.0


def test_iqm_is_taken_over_the_last_axis() -> None:
    x = np.array([[4.0, 1.0, 3.0, 2.0], [0.0, 0.0, 0.0, 8.0], [5.0, 6.0, 7.0, 8.0]])
    got = st._iqm(x)
    assert got.shape == (3,) and got.tolist() == [2.5, 0.0, 6.5]
    rng = np.random.default_rng(0)
    y = rng.random((6, 7))
    np.testing.assert_allclose(st._iqm(y), _trim(y), rtol=1e-14)


def _wilson(q: float, n: float, z: float) -> tuple[float, float]:
    """Wilson's score interval for a proportion q of n, quantile z (the textbook formula)."""
    center = (q + z ** 2 / (2 * n)) / (1 + z ** 2 / n)
    half = z * math.sqrt(q * (1 - q) / n + z ** 2 / (4 * n ** 2)) / (1 + z ** 2 / n)
    return center - half, center + half


@pytest.mark.parametrize("est, se, df, level", [(0.4, 0.05, 3.0, 0.9), (0.97, 0.02, 2.0, 0.95),
                                                (0.4, 0.05, math.inf, 0.95), (0.02, 0.015, 7, 0.5)])
def test_bounded_interval_is_wilsons_at_the_effective_size(est: float, se: float, df: float,
                                                          level: float) -> None:
    z = float(sps.t.ppf(0.5 + level / 2, df))
    lo, hi = st.bounded_interval(est, se, df, level)
    assert (lo, hi) == pytest.approx(_wilson(est, est * (1 - est) / se ** 2, z), rel=1e-12)
    assert 0.0 <= lo <= hi <= 1.0
    t_lo, t_hi = _t(est, se, df, level)
    assert lo >= t_lo - 1e-12 or hi <= t_hi + 1e-12  # pulled in at the near end, if anywhere


def test_bounded_interval_maps_a_difference_and_handles_the_ends() -> None:
    z = float(sps.t.ppf(0.975, 4))
    # a difference d in [-1, 1] is q = (d + 1) / 2 with SE / 2
    lo, hi = st.bounded_interval(0.9, 0.06, 4, 0.95, -1.0, 1.0)
    q_lo, q_hi = _wilson(0.95, 0.95 * 0.05 / 0.03 ** 2, z)
    assert (lo, hi) == pytest.approx((2 * q_lo - 1, 2 * q_hi - 1), rel=1e-12)
    assert hi <= 1.0 and st.bounded_interval(0.9, 0.06, 4, 0.95)[1] <= 1.0
    # every score at an end: Wilson's interval for 0 (or all) of the count
    assert st.bounded_interval(0.0, 0.0, 4, 0.95, count=300) == pytest.approx(
        (0.0, z ** 2 / (300 + z ** 2)), abs=1e-15)
    assert st.bounded_interval(1.0, 0.0, 4, 0.95, count=300) == pytest.approx(
        (300 / (300 + z ** 2), 1.0), rel=1e-12)
    assert st.bounded_interval(-1.0, 0.0, 4, 0.95, -1.0, 1.0, count=300)[0] == -1.0
    # Wilson's upper end at all-correct is 1 in exact arithmetic and 1 + 2e-16 in floats for
    # many counts (20 at 2 df): the range still holds it
    assert st.bounded_interval(1.0, 0.0, 2, 0.95, count=20)[1] == 1.0
    # no spread and no count, or mid-range without spread: the point
    assert st.bounded_interval(0.0, 0.0, 4) == (0.0, 0.0)
    assert st.bounded_interval(0.3, 0.0, 4, count=300) == (0.3, 0.3)


def test_p_value_is_two_sided_t() -> None:
    assert st._p_value(0.3, 0.1, 4) == pytest.approx(2 * sps.t.sf(3, 4), rel=1e-12)
    assert st._p_value(-0.3, 0.1, 4) == pytest.approx(2 * sps.t.sf(3, 4), rel=1e-12)
    assert st._p_value(0.02, 0.01, math.inf) == pytest.approx(2 * sps.norm.sf(2), rel=1e-12)
    assert st._p_value(0.05, 0.02, 2.5) == pytest.approx(2 * sps.t.sf(2.5, 2.5), rel=1e-12)
    assert st._p_value(0.0, 0.1, 3) == 1.0


def test_p_value_without_noise_is_certain() -> None:
    assert st._p_value(0.0, 0.0, 3) == 1.0
    assert st._p_value(0.2, 0.0, 3) == 0.0
    assert st._p_value(-0.2, 0.0, math.inf) == 0.0
    assert st._p_value(0.0, -1.0, 3) == 1.0 and st._p_value(0.1, -1.0, 3) == 0.0


def test_improvement_counts_wins_and_half_the_ties() -> None:
    assert st._improvement(np.array([0.5, 0.0, -0.5, 0.0, 2.0])) == pytest.approx(0.6)
    assert st._improvement(np.array([0.25, 0.75, 1.5, -1.0])) == 0.75
    assert st._improvement(np.zeros(7)) == 0.5
    assert st._improvement(np.array([-0.1, -2.0])) == 0.0
    assert st._improvement(np.array([0.0, 0.0, 0.0, 3.0])) == pytest.approx(0.625)


# -- mde -------------------------------------------------------------------------------------

def test_mde_with_many_df_is_the_normal_sum() -> None:
    z = float(sps.norm.ppf(0.975) + sps.norm.ppf(0.8))
    assert st.mde(1.0) == pytest.approx(z, rel=1e-12)
    assert st.mde(2.0) == pytest.approx(2 * z, rel=1e-12)
    assert st.mde(1.3) == st.mde(1.3, math.inf, alpha=0.05, power=0.8)
    assert st.mde(2.0, 10000.5) == pytest.approx(2 * z, rel=1e-12)
    assert st.mde(2.0, alpha=0.1, power=0.9) == pytest.approx(_mde(2.0, math.inf, 0.1, 0.9),
                                                              rel=1e-12)
    assert st.mde(0.5, 1e6, alpha=0.01, power=0.5) == pytest.approx(
        0.5 * sps.norm.ppf(0.995), rel=1e-12)


@pytest.mark.parametrize("se, df, alpha, power", [
    (1.0, 2.0, 0.05, 0.8), (0.5, 3.0, 0.1, 0.9), (2.0, 7.5, 0.01, 0.5), (1.0, 1e4, 0.05, 0.8),
    (1.0, 1.0, 0.05, 0.999),  # the first bracket is too short: it is widened
    (1.0, 5.0, 0.05, 0.03),   # an effect under one SE
])
def test_mde_with_few_df_is_the_noncentral_t(se: float, df: float, alpha: float,
                                             power: float) -> None:
    assert st.mde(se, df, alpha=alpha, power=power) == pytest.approx(
        _mde(se, df, alpha, power), rel=1e-9)


def test_mde_defaults_are_alpha_005_and_power_08() -> None:
    assert st.mde(1.0, 4) == pytest.approx(_mde(1.0, 4, 0.05, 0.8), rel=1e-9)
    assert st.mde(1.0, 4) == st.mde(1.0, 4, alpha=0.05, power=0.8)
    assert st.mde(1.0, 4, alpha=0.1) < st.mde(1.0, 4) < st.mde(1.0, 4, power=0.9)
    assert st.mde(1.0, 2) == pytest.approx(5.65, abs=0.01)


# -- the dataclasses --------------------------------------------------------------------------

def test_difference_defaults_to_a_5_percent_test_at_80_percent_power() -> None:
    d = st.Difference("AVG", 0.1, 0.02, 0.0, 0.2, 3.0, 0.04, None, 0.02, 3, 10)
    assert d.alpha == 0.05 and d.power == 0.8
    assert d.mde == pytest.approx(_mde(0.02, 3.0, 0.05, 0.8), rel=1e-9)


def test_difference_mde_uses_its_own_alpha_and_power() -> None:
    d = st.Difference("AVG", 0.1, 0.02, 0.0, 0.2, 3.0, 0.04, None, 0.02, 3, 10, 0.01, 0.9)
    assert d.mde == pytest.approx(_mde(0.02, 3.0, 0.01, 0.9), rel=1e-9)
    inf = st.Difference("AVG", 0.1, 0.5, 0.0, 0.2, math.inf, 0.04, None, 0.5, 3, 10, 0.2, 0.6)
    assert inf.mde == pytest.approx(_mde(0.5, math.inf, 0.2, 0.6), rel=1e-12)
    iqm = st.Difference(st.IQM, 0.1, 0.02, 0.0, 0.2, math.inf, None, 0.9, None, 3, 10)
    assert iqm.mde is None


def test_estimates_and_differences_are_frozen() -> None:
    e = st.Estimate("x", 0.5, 0.1, 0.3, 0.7, 2.0, 0.1, 3, 10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.estimate = 0.6  # type: ignore[misc]
    assert st.AVG == "AVG" and st.IQM == "IQM" and st.N_BOOT == 2000


# -- cell_estimates -------------------------------------------------------------------------

def _check_estimates(cell: Scores, n_boot: int, seed: int, level: float) -> None:
    found = st.cell_estimates(cell, n_boot=n_boot, seed=seed, level=level)
    comps = _components(cell)
    reps = _replicates(cell, n_boot, seed) if n_boot else {}
    s = np.shape(next(iter(cell.values())))[0]
    sizes = [np.shape(y)[1] for y in cell.values()]
    means = [float(np.mean(y)) for y in cell.values()]
    points = dict(zip(cell, means, strict=True))
    points[st.AVG] = float(np.mean(means))  # equal seeds: the mean of the seeds' AVGs
    assert list(found) == [*cell, st.AVG] + ([st.IQM] if n_boot else [])
    for k, name in enumerate([*cell, st.AVG]):
        e, c = found[name], comps[name]
        se = float(np.std(reps[name], ddof=1)) if n_boot else _se(c)
        assert e.name == name and e.n_seeds == s
        assert e.n_problems == (sizes[k] if name in cell else sum(sizes))
        assert e.estimate == pytest.approx(points[name], rel=1e-12)
        assert e.se == pytest.approx(se, rel=1e-9, abs=1e-15), name
        assert e.se_analytic == pytest.approx(_se(c), rel=1e-10, abs=1e-15), name
        assert e.df == pytest.approx(_df(c), rel=1e-10), name
        expected = _bounded(points[name], se, _df(c), level, 0.0, s * e.n_problems)
        assert (e.lo, e.hi) == pytest.approx(expected, rel=1e-9, abs=1e-12), name
    if n_boot:
        iqm = found[st.IQM]
        iqm_reps = np.clip(_trim(np.stack([reps[n] for n in cell], axis=1)), 0, 1)
        assert iqm.name == st.IQM and iqm.df == math.inf and iqm.se_analytic is None
        assert iqm.n_seeds == s and iqm.n_problems == sum(sizes)
        assert iqm.estimate == pytest.approx(float(_trim(np.array(means))), rel=1e-12)
        assert iqm.se == pytest.approx(float(np.std(iqm_reps, ddof=1)), rel=1e-9)
        lo, hi = np.quantile(iqm_reps, [(1 - level) / 2, (1 + level) / 2])
        assert (iqm.lo, iqm.hi) == pytest.approx((lo, hi), rel=1e-9)


@pytest.mark.parametrize("level", [0.95, 0.8])
def test_cell_estimates_are_the_bootstrap_se_in_a_t_interval(level: float) -> None:
    _check_estimates(A, 200, 5, level)


def test_cell_estimates_of_two_seeds_and_three_benchmarks() -> None:
    _check_estimates(_grades(40, 2, (6, 3, 9)), 150, 0, 0.9)


def test_cell_estimates_of_one_seed() -> None:
    _check_estimates(_grades(41, 1, (8, 5, 6, 7, 4)), 150, 2, 0.95)


def test_cell_estimates_without_bootstrap_are_analytic() -> None:
    _check_estimates(A, 0, 0, 0.95)
    _check_estimates(_grades(42, 2, (3, 5)), 0, 9, 0.7)
    assert st.cell_estimates(A, n_boot=0, seed=1) == st.cell_estimates(A, n_boot=0, seed=2)


def test_cell_estimates_of_the_worked_example() -> None:
    e = st.cell_estimates({"x": HAND}, n_boot=0)
    assert e["x"].estimate == 0.5 and e["x"].se == pytest.approx(math.sqrt(1 / 12), rel=EXACT)
    assert e["x"].df == pytest.approx(1.5, rel=EXACT)
    # at 0.5 Wilson's interval at the effective size (0.25 / (1/12) = 3) is symmetric:
    # 0.5 +- z sqrt(0.25 / 3 + z^2 / 36) / (1 + z^2 / 3), z = t(1.5)'s 97.5% point
    z = float(sps.t.ppf(0.975, 1.5))
    half = z * math.sqrt(0.25 / 3 + z * z / 36) / (1 + z * z / 3)
    assert e["x"].lo == pytest.approx(max(0.0, 0.5 - half), rel=1e-12)
    assert e["x"].hi == pytest.approx(min(1.0, 0.5 + half), rel=1e-12)
    assert e[st.AVG] == dataclasses.replace(e["x"], name=st.AVG)


def test_cell_estimates_avg_is_the_unweighted_mean_of_benchmarks() -> None:
    cell = {"x": np.array([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]),
            "y": np.array([[0.0, 1.0], [0.0, 0.0]])}
    e = st.cell_estimates(cell, n_boot=0)
    assert e["x"].estimate == 1.0 and e["y"].estimate == 0.25
    assert e[st.AVG].estimate == 0.625      # not the pooled 10 / 12 ... per problem
    assert e[st.AVG].n_problems == 6 and e["x"].n_problems == 4 and e["y"].n_problems == 2


def test_cell_estimates_of_a_constant_cell_have_no_width() -> None:
    # dyadic scores: every mean is exact, so no rounding noise poses as a variance
    flat = {"x": np.full((3, 5), 0.25), "y": np.full((3, 4), 0.75), "z": np.full((3, 2), 0.5)}
    for e in st.cell_estimates(flat, n_boot=100).values():
        assert e.se == 0.0 and e.lo == e.hi == e.estimate, e.name
        assert e.df == math.inf
    assert st.cell_estimates(flat, n_boot=100)[st.IQM].estimate == pytest.approx(0.5)


def test_cell_estimates_defaults() -> None:
    """n_boot 2000, seed 0, a 95% interval: the same as naming them, not as other values."""
    cell = _grades(43, 3, (6, 4, 5, 3))
    default = st.cell_estimates(cell)
    assert default == st.cell_estimates(cell, n_boot=2000, seed=0, level=0.95)
    assert default != st.cell_estimates(cell, n_boot=2000, seed=1, level=0.95)
    assert default != st.cell_estimates(cell, n_boot=2001, seed=0, level=0.95)
    _check_estimates(cell, 2000, 0, 0.95)


def test_cell_estimates_seed_moves_the_se_not_the_estimate() -> None:
    one = st.cell_estimates(A, n_boot=200, seed=0)
    two = st.cell_estimates(A, n_boot=200, seed=1)
    for name in one:
        assert one[name].estimate == two[name].estimate
        assert one[name].se != two[name].se, name


def test_cell_estimates_check_the_cell() -> None:
    _raises(st.cell_estimates, "b0: scores must be finite and in [0, 1]", D, n_boot=0)
    _raises(st.cell_estimates, "a cell needs at least one benchmark", {})


# -- difference_cell, mean_cell ----------------------------------------------------------------

def test_difference_cell_is_a_minus_b_problem_by_problem() -> None:
    a = {"x": np.array([[1, 0.5], [0, 0.25]]), "y": np.array([[1, 1, 0], [1, 1, 0]])}
    b = {"x": np.array([[0, 0.75], [1, 0.25]]), "y": np.array([[0.5, 1, 1], [0.5, 1, 1]])}
    d = st.difference_cell(a, b)
    assert list(d) == ["x", "y"]
    assert d["x"].tolist() == [[1.0, -0.25], [-1.0, 0.0]]
    assert d["y"].tolist() == [[0.5, 0.0, -1.0]] * 2
    assert d["x"].dtype == np.float64
    _raises(st.difference_cell, "x: (2, 2) vs (2, 3) (paired cells share seeds and problems)",
            {"x": np.zeros((2, 2))}, {"x": np.zeros((2, 3))})


def test_mean_cell_is_the_problem_by_problem_mean() -> None:
    cells = [{"x": np.zeros((2, 3)), "y": np.ones((2, 2))},
             {"x": np.ones((2, 3)), "y": np.ones((2, 2))},
             {"x": np.array([[0.5, 1.0, 0.0], [0.0, 0.0, 1.0]]), "y": np.zeros((2, 2))}]
    m = st.mean_cell(cells)
    assert list(m) == ["x", "y"]
    np.testing.assert_allclose(m["x"], [[0.5, 2 / 3, 1 / 3], [1 / 3, 1 / 3, 2 / 3]], rtol=1e-15)
    np.testing.assert_allclose(m["y"], np.full((2, 2), 2 / 3), rtol=1e-15)
    one = st.mean_cell(cells[2:])
    assert one["x"].tolist() == cells[2]["x"].tolist() and one["x"].shape == (2, 3)


def test_mean_cell_checks_every_cell_against_the_first() -> None:
    good = {"x": np.zeros((2, 3))}
    message = "x: (2, 3) vs (2, 4) (paired cells share seeds and problems)"
    _raises(st.mean_cell, message, [good, {"x": np.zeros((2, 4))}])
    _raises(st.mean_cell, message, [good, good, {"x": np.zeros((2, 4))}])


# -- paired_difference --------------------------------------------------------------------------

def _check_difference(a: Scores, b: Scores, n_boot: int, seed: int, level: float,
                      alpha: float = 0.05, power: float = 0.8,
                      found: Mapping[str, st.Difference] | None = None) -> None:
    if found is None:
        found = st.paired_difference(a, b, n_boot=n_boot, seed=seed, level=level, alpha=alpha,
                                     power=power)
    d = {n: np.asarray(a[n], dtype=float) - np.asarray(b[n], dtype=float) for n in a}
    comps = _components(d)
    reps = _replicates(d, n_boot, seed) if n_boot else {}
    s = np.shape(next(iter(a.values())))[0]
    sizes = [np.shape(y)[1] for y in a.values()]
    points = {n: float(np.mean(d[n])) for n in d}
    points[st.AVG] = float(np.mean(list(points.values())))
    assert list(found) == [*a, st.AVG] + ([st.IQM] if n_boot else [])
    for k, name in enumerate([*a, st.AVG]):
        x, c = found[name], comps[name]
        se = float(np.std(reps[name], ddof=1)) if n_boot else _se(c)
        df = _df(c)
        assert x.name == name and x.n_seeds == s and (x.alpha, x.power) == (alpha, power)
        assert x.n_problems == (sizes[k] if name in a else sum(sizes))
        assert x.estimate == pytest.approx(points[name], rel=1e-12, abs=1e-15), name
        assert x.se == pytest.approx(se, rel=1e-9, abs=1e-15), name
        assert x.se_analytic == pytest.approx(_se(c), rel=1e-10, abs=1e-15), name
        assert x.df == pytest.approx(df, rel=1e-10), name
        expected = _bounded(points[name], se, df, level, -1.0, s * x.n_problems)
        assert (x.lo, x.hi) == pytest.approx(expected, rel=1e-9, abs=1e-12), name
        p = float(2 * sps.t.sf(abs(points[name]) / se, df)) if se > 0 else float(
            points[name] == 0)
        assert x.p == pytest.approx(p, rel=1e-8, abs=1e-14), name
        if n_boot:
            wins = float(np.mean(reps[name] > 0) + np.mean(reps[name] == 0) / 2)
            assert x.prob_improvement == pytest.approx(wins, abs=1e-12), name
        else:
            assert x.prob_improvement is None
        assert x.mde == pytest.approx(_mde(se, df, alpha, power) if se > 0 else 0.0,
                                      rel=1e-8, abs=1e-15), name
    if n_boot:
        iqm = found[st.IQM]
        ra, rb = _replicates(a, n_boot, seed), _replicates(b, n_boot, seed)
        iqm_reps = (np.clip(_trim(np.stack([ra[n] for n in a], axis=1)), 0, 1)
                    - np.clip(_trim(np.stack([rb[n] for n in a], axis=1)), 0, 1))
        est = float(_trim(np.array([np.mean(a[n]) for n in a]))
                    - _trim(np.array([np.mean(b[n]) for n in a])))
        assert iqm.name == st.IQM and iqm.p is None and iqm.se_analytic is None
        assert iqm.df == math.inf and iqm.mde is None
        assert iqm.n_seeds == s and iqm.n_problems == sum(sizes)
        assert (iqm.alpha, iqm.power) == (alpha, power)
        assert iqm.estimate == pytest.approx(est, rel=1e-12, abs=1e-15)
        assert iqm.se == pytest.approx(float(np.std(iqm_reps, ddof=1)), rel=1e-9, abs=1e-15)
        lo, hi = np.quantile(iqm_reps, [(1 - level) / 2, (1 + level) / 2])
        assert (iqm.lo, iqm.hi) == pytest.approx((lo, hi), rel=1e-9, abs=1e-12)
        wins = float(np.mean(iqm_reps > 0) + np.mean(iqm_reps == 0) / 2)
        assert iqm.prob_improvement == pytest.approx(wins, abs=1e-12)


def test_paired_difference_is_the_difference_cell_bootstrapped_with_its_pair() -> None:
    _check_difference(A, B, 200, 7, 0.95)
    _check_difference(B, A, 200, 7, 0.9, alpha=0.1, power=0.9)


def test_paired_difference_of_few_seeds_and_benchmarks() -> None:
    _check_difference(_grades(50, 2, (5, 3, 6)), _grades(51, 2, (5, 3, 6)), 150, 1, 0.8)
    _check_difference(_grades(52, 1, (7, 4, 5, 6, 3)), _grades(53, 1, (7, 4, 5, 6, 3)), 120, 3,
                      0.95, alpha=0.01, power=0.5)


def test_paired_difference_without_bootstrap_is_analytic() -> None:
    _check_difference(A, B, 0, 0, 0.95)
    _check_difference(A, B, 0, 0, 0.9, alpha=0.2, power=0.6)


def test_paired_difference_of_a_cell_with_itself_is_exactly_nothing() -> None:
    same = st.paired_difference(A, A, n_boot=100, seed=3)
    assert list(same) == [*A, st.AVG, st.IQM]
    for name, d in same.items():
        assert d.estimate == 0 and d.se == 0 and d.lo == 0 and d.hi == 0, name
        assert d.prob_improvement == 0.5, name
        assert d.p == (None if name == st.IQM else 1.0), name
    assert same[st.AVG].mde == 0.0 and same[st.AVG].df == math.inf


def test_paired_difference_of_a_sure_gain() -> None:
    """B is A less a quarter point on every problem: no spread in the difference, p 0."""
    b = {n: np.maximum(A[n] - 0.25, 0.0) for n in A}
    a = {n: b[n] + 0.25 for n in A}
    gain = st.paired_difference(a, b, n_boot=100)
    for name in [*A, st.AVG]:
        assert gain[name].estimate == pytest.approx(0.25, rel=1e-12)
        assert gain[name].se == pytest.approx(0.0, abs=1e-12)
        assert gain[name].prob_improvement == 1.0
        assert gain[name].p == pytest.approx(0.0, abs=1e-12)
    loss = st.paired_difference(b, a, n_boot=100)
    assert loss[st.AVG].prob_improvement == 0.0 and loss[st.IQM].prob_improvement == 0.0
    assert loss[st.AVG].estimate == pytest.approx(-0.25, rel=1e-12)


def test_paired_difference_defaults() -> None:
    """n_boot 2000, seed 0, 95%, alpha 0.05, power 0.8: as named, and not as other values."""
    a, b = _grades(60, 3, (5, 4, 6, 3)), _grades(61, 3, (5, 4, 6, 3))
    default = st.paired_difference(a, b)
    assert default == st.paired_difference(a, b, n_boot=2000, seed=0, level=0.95, alpha=0.05,
                                           power=0.8)
    assert default != st.paired_difference(a, b, n_boot=2000, seed=1)
    assert default != st.paired_difference(a, b, n_boot=1999)
    assert all((d.alpha, d.power) == (0.05, 0.8) for d in default.values())
    _check_difference(a, b, 2000, 0, 0.95, found=default)


def test_paired_difference_seed_moves_the_se_not_the_estimate() -> None:
    one = st.paired_difference(A, B, n_boot=200, seed=0)
    two = st.paired_difference(A, B, n_boot=200, seed=1)
    for name in one:
        assert one[name].estimate == two[name].estimate
        assert one[name].se != two[name].se, name


def test_paired_difference_checks_the_pair() -> None:
    _raises(st.paired_difference, "b0: (3, 5) vs (3, 4) (paired cells share seeds and problems)",
            A, {**B, "b0": np.zeros((3, 4))}, n_boot=0)
    _raises(st.paired_difference, "b0: scores must be finite and in [0, 1]", A, D, n_boot=0)


def test_paired_difference_of_mean_cells_is_the_mean_difference() -> None:
    a2, b2 = _grades(70, 3, SIZES), _grades(71, 3, SIZES)
    both = st.paired_difference(st.mean_cell([A, a2]), st.mean_cell([B, b2]), n_boot=0)
    each = [st.paired_difference(x, y, n_boot=0)[st.AVG].estimate for x, y in ((A, B), (a2, b2))]
    assert both[st.AVG].estimate == pytest.approx(np.mean(each), rel=1e-12)



def test_mde_refuses_a_power_no_test_can_miss_with() -> None:
    """power <= alpha / 2: every test "finds" even no effect that often; one clear error on both
    the normal and the noncentral-t branch (not brentq's, not a negative MDE)."""
    for df in (5.0, math.inf):
        with pytest.raises(ValueError, match=r"power 0.02 must lie in \(alpha / 2, 1\) = "
                                             r"\(0.025, 1\)"):
            st.mde(1.0, df, power=0.02)
        with pytest.raises(ValueError, match="power 1.0 must lie"):
            st.mde(1.0, df, power=1.0)
        with pytest.raises(ValueError, match="power 0.025 must lie"):
            st.mde(1.0, df, power=0.025)  # exactly alpha / 2: still no test
    assert st.mde(1.0, math.inf, power=0.026) > 0


def test_mean_cell_of_no_cells_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="^mean_cell needs at least one cell$"):
        st.mean_cell([])


def test_the_point_estimate_of_float32_scores_is_exact() -> None:
    """The estimate is computed in float64 like its SE, whatever the scores' dtype."""
    y = np.array([[1, 0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 1, 1]], dtype=np.float32)
    est = st.cell_estimates({"b": y}, n_boot=0)
    assert est["b"].estimate == 9 / 14
