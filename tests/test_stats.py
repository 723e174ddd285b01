"""analysis.stats, .power, .verdicts, .seed_stats against simulations with a known truth.

The simulated experiments are built like the tiny Table-1 design: seven benchmarks of
different difficulty (~1200 problems each; fewer where a test needs many experiments),
3 paired seeds, per-problem solve rates spread from always to never (Beta, U-shaped), the two
methods correlated through the shared problems, a seed effect per method and run, and
optionally a problem x method effect. The population truth is known exactly: benchmark b's
accuracy is MEANS[b] (+ the method's effect), on average over problems and seeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
from scipy import stats as sps

from analysis import power as pw
from analysis import seed_stats as ss
from analysis import stats as st
from analysis import verdicts as vd
from analysis.reference import paper

MEANS = (0.6, 0.5, 0.8, 0.1, 0.3, 0.25, 0.3)  # the seven benchmarks' accuracies
CONCENTRATION = 1.0  # Beta(m c, (1 - m) c) solve rates: most problems near always / never
CORRELATION = 1 / (CONCENTRATION + 1)  # of A's and B's 0/1 scores on a problem and seed
NAMES = tuple(f"bench{k}" for k in range(len(MEANS)))
TINY = 1200  # problems per benchmark in the tiny design


def _shift(rate: np.ndarray, delta: np.ndarray, mean: float) -> np.ndarray:
    """Solve rates moved by `delta` on average over the population (mean + delta exactly),
    staying in [0, 1]: a rise closes the gap to 1 in proportion, a fall the gap to 0."""
    return np.where(delta >= 0, rate + delta * (1 - rate) / (1 - mean), rate + delta * rate / mean)


def simulate(rng: np.random.Generator, n: int, *, problems: int = TINY, seeds: int = 3,
             effect: float = 0.0, seed_sd: float = 0.0,
             interaction_sd: float = 0.0) -> Iterator[tuple[dict, dict]]:
    """`n` paired experiments (A, B): cells benchmark -> 0/1 scores [seeds, problems].
    A is better than B by `effect` on every benchmark (so on AVG); each method's run with
    seed s is better or worse by N(0, seed_sd) on every benchmark; `interaction_sd`: a
    problem-level difference (+u for A, -u for B, the same for every seed)."""
    chunk = 100
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        scores = []
        level = rng.normal(0, seed_sd, size=(2, m, seeds, 1))   # one per method and run
        for mean in MEANS:
            rate = rng.beta(mean * CONCENTRATION, (1 - mean) * CONCENTRATION,
                            size=(m, 1, problems))
            u = rng.normal(0, interaction_sd, size=(m, 1, problems))
            rate_a = np.clip(_shift(rate, effect + level[0], mean) + u, 0, 1)
            rate_b = np.clip(_shift(rate, level[1], mean) - u, 0, 1)
            shape = (m, seeds, problems)
            scores.append((rng.random(shape) < rate_a, rng.random(shape) < rate_b))
        for i in range(m):
            yield ({n_: s[0][i].astype(float) for n_, s in zip(NAMES, scores, strict=True)},
                   {n_: s[1][i].astype(float) for n_, s in zip(NAMES, scores, strict=True)})


def design(problems: int = TINY, seeds: int = 3, seed_sd: float = 0.0) -> pw.Design:
    """The simulation's design as the planner sees it (true variances, not estimates)."""
    return pw.Design((problems,) * len(MEANS), seeds, tuple(m * (1 - m) for m in MEANS),
                     (CORRELATION,) * len(MEANS), seed_sd ** 2)


def _rate(hits: list[bool], nominal: float) -> tuple[float, float]:
    """The observed rate, and the binomial standard error of a rate at its nominal value."""
    return float(np.mean(hits)), math.sqrt(nominal * (1 - nominal) / len(hits))


# -- the data model ----------------------------------------------------------------------------

def test_cells_are_checked() -> None:
    good = {"a": np.zeros((3, 5)), "b": np.ones((3, 7))}
    assert st.check_cell(good) == 3 and st.check_pair(good, good) == 3
    with pytest.raises(ValueError, match="n_seeds >= 1, n_problems >= 2"):
        st.check_cell({"a": np.zeros(5)})
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        st.check_cell({"a": np.full((2, 3), np.nan)})
    with pytest.raises(ValueError, match="same seeds"):
        st.check_cell({"a": np.zeros((3, 5)), "b": np.zeros((2, 5))})
    with pytest.raises(ValueError, match="share seeds and problems"):
        st.check_pair(good, {"a": np.zeros((3, 6)), "b": np.ones((3, 7))})
    with pytest.raises(ValueError, match="same benchmarks"):
        st.check_pair(good, {"b": np.ones((3, 7)), "a": np.zeros((3, 5))})
    avg = st.mean_cell([good, {"a": np.ones((3, 5)), "b": np.ones((3, 7))}])
    assert np.all(avg["a"] == 0.5) and np.all(avg["b"] == 1)


def test_one_seed_is_a_problem_bootstrap() -> None:
    rng = np.random.default_rng(1)
    y = (rng.random((1, 500)) < rng.beta(0.5, 0.5, 500)).astype(float)
    comp = st.components({"x": y})["x"]
    assert comp.seeds == 0 and comp.problems == pytest.approx(y.var(ddof=1) / 500)
    assert comp.df == pytest.approx(499)
    est = st.cell_estimates({"x": y}, n_boot=4000, seed=3)["x"]
    plain = y[0][rng.integers(0, 500, size=(4000, 500))].mean(1).std(ddof=1)
    assert est.se == pytest.approx(plain, rel=0.05)           # the textbook problem bootstrap
    assert est.se == pytest.approx(comp.se, rel=0.05)


# -- (d) bootstrap SE = analytic SE ------------------------------------------------------------

@pytest.mark.parametrize("problems, seeds, seed_sd", [(TINY, 3, 0.005), (300, 5, 0.01)])
def test_bootstrap_se_agrees_with_the_analytic_se(problems, seeds, seed_sd) -> None:
    """At the tiny design and with more seeds: every benchmark, AVG, a cell and a paired
    difference; 2000 replicates give the SE within about 1.6% (Monte Carlo), so 6% is 4 SE."""
    a, b = next(simulate(np.random.default_rng(2), 1, problems=problems, seeds=seeds,
                         effect=0.02, seed_sd=seed_sd))
    for name, e in st.cell_estimates(a, seed=4).items():
        if name != st.IQM:
            assert e.se == pytest.approx(e.se_analytic, rel=0.06), name
            assert e.lo < e.estimate < e.hi
    diffs = st.paired_difference(a, b, seed=5)
    for name, d in diffs.items():
        if name != st.IQM:
            assert d.se == pytest.approx(d.se_analytic, rel=0.06), name
    # the same seed draws the same problems and seeds: paired and reproducible
    again = st.paired_difference(a, b, seed=5)
    assert again[st.AVG] == diffs[st.AVG] and again[st.IQM] == diffs[st.IQM]


def test_the_plain_two_way_bootstrap_would_be_too_wide() -> None:
    """Why the bootstrap resamples effects, not the score table: resampling rows and columns
    of a paired difference counts the seed x problem noise 1 + 2(S-1)/S = 2.3 times at 3
    seeds. Averaged over experiments, its variance is about 2.3 times the true one; ours ~1."""
    rng = np.random.default_rng(6)
    truth = pw.plan(pw.Design((500,), 3, (0.25,), (CORRELATION,))).se ** 2
    ours, plain = [], []
    for a, b in simulate(rng, 40, problems=500):
        x, y = a[NAMES[1]], b[NAMES[1]]  # the 50% benchmark
        ours.append(st.paired_difference({"x": x}, {"x": y}, n_boot=400)["x"].se ** 2)
        rows = rng.integers(0, 3, size=(400, 3))
        cols = rng.integers(0, 500, size=(400, 500))
        table = (x - y)[rows[:, :, None], cols[:, None, :]]   # [replicate, seed, problem]
        plain.append(table.mean(axis=(1, 2)).var(ddof=1))
    assert 0.8 < np.mean(ours) / truth < 1.2
    assert 1.9 < np.mean(plain) / truth < 2.8


# -- (a) size: no true difference --------------------------------------------------------------

def _rejections(experiments: Iterator[tuple[dict, dict]]) -> tuple[list[bool], list[bool]]:
    """Per experiment: p < 0.05 (two-sided), and 'supported' (A > B significant)."""
    rejected, supported = [], []
    for a, b in experiments:
        d = st.paired_difference(a, b, n_boot=0)[st.AVG]
        assert d.p is not None
        rejected.append(d.p < 0.05)
        supported.append(d.p < 0.05 and d.estimate > 0)
    return rejected, supported


@pytest.mark.parametrize("problems, n, seed_sd, interaction_sd", [
    (TINY, 1000, 0.005, 0.0),   # the tiny design
    (300, 1000, 0.0, 0.0),      # no seed effect: the seeds' 2 df still carry the noise
    (300, 1000, 0.012, 0.0),    # a seed effect larger than the problems' noise
    (300, 1000, 0.0, 0.1),      # a problem x method effect next to the seed noise
])
def test_no_true_difference_is_rarely_supported(problems, n, seed_sd, interaction_sd) -> None:
    """(a) At zero true effect 'supported' stays at its nominal alpha / 2 = 2.5% and the
    two-sided rejections at 5%, within 3 binomial SE (measured: 1.5-2.8% and 2.9-5.1%)."""
    rng = np.random.default_rng(7)
    rejected, supported = _rejections(simulate(rng, n, problems=problems, seed_sd=seed_sd,
                                               interaction_sd=interaction_sd))
    rate, se = _rate(rejected, 0.05)
    assert rate <= 0.05 + 3 * se, rate
    rate, se = _rate(supported, 0.025)
    assert rate <= 0.025 + 3 * se, rate


def test_holm_keeps_a_family_of_six_from_false_support() -> None:
    """Six comparisons per claim, none true: with Holm, some 'supported' in at most ~alpha of
    the claims; without a correction in about 1 - 0.975^6 = 14% of them."""
    rng = np.random.default_rng(8)
    runs = simulate(rng, 300 * 6, problems=150)
    any_holm, any_raw = [], []
    for _ in range(300):
        diffs = [st.paired_difference(a, b, n_boot=0)[st.AVG] for a, b in
                 (next(runs) for _ in range(6))]
        verdict = vd.judge("A > B for every agent", [(f"agent {k}", d)
                                                      for k, d in enumerate(diffs)])
        any_holm.append(any(c.verdict == vd.SUPPORTED for c in verdict.comparisons))
        any_raw.append(any(d.p is not None and d.p < 0.05 and d.estimate > 0 for d in diffs))
    rate, se = _rate(any_holm, 0.05)
    assert rate <= 0.05 + 3 * se, rate
    assert np.mean(any_raw) > 0.07


# -- (b) power: a true 3-point AVG gain --------------------------------------------------------

@pytest.mark.parametrize("problems, seeds, effect, seed_sd, n", [
    (TINY, 3, 0.03, 0.008, 800),   # the tiny design: predicted power 0.60
    (300, 5, 0.02, 0.006, 600),    # five seeds, fewer problems
])
def test_power_is_what_the_plan_predicts(problems, seeds, effect, seed_sd, n) -> None:
    """(b) The share of experiments that find the gain is the planner's power within 0.05
    (3 binomial SE at n = 800; measured within 0.015)."""
    plan = pw.plan(design(problems, seeds, seed_sd))
    predicted = plan.power_at(effect)
    assert 0.3 < predicted < 0.95  # a regime where power is informative
    _, supported = _rejections(simulate(np.random.default_rng(9), n, problems=problems,
                                        seeds=seeds, effect=effect, seed_sd=seed_sd))
    assert np.mean(supported) == pytest.approx(predicted, abs=0.05)


def test_mde_and_planning() -> None:
    z = sps.norm.ppf(0.975) + sps.norm.ppf(0.8)
    assert st.mde(1.0) == pytest.approx(z) and st.mde(0.01, 1e6) == pytest.approx(0.01 * z)
    assert st.mde(1.0, 2) == pytest.approx(5.65, abs=0.01)  # not 4.30 + 1.06 = 5.36
    plan = pw.plan(design(seed_sd=0.005))
    same = pw.Design.uniform(7, TINY, 3, 0.2, CORRELATION, 0.005 ** 2)
    assert pw.plan(same).se == pytest.approx(plan.se, rel=0.2)   # a rough plan: one variance
    assert plan.df == pytest.approx(2, abs=0.01)   # a paired difference: the seeds' df
    assert plan.power_at(plan.mde) == pytest.approx(0.8, abs=1e-6)
    assert plan.power_at(0) == pytest.approx(0.025, abs=1e-6)
    five = pw.plan(design(seed_sd=0.005).with_seeds(5))
    assert five.se < plan.se and five.mde < plan.mde and five.df == pytest.approx(4, abs=0.01)
    seeds = pw.needed_seeds(design(seed_sd=0.005), 0.02)
    assert seeds is not None and pw.plan(design(seed_sd=0.005).with_seeds(seeds)).mde <= 0.02
    assert pw.plan(design(seed_sd=0.005).with_seeds(seeds - 1)).mde > 0.02
    one = pw.plan(design(seed_sd=0.005).with_seeds(1))
    assert one.df > 1000 and one.se > pw.plan(design()).se  # the run's own seed luck is in


def test_the_design_of_a_pilot_recovers_the_simulation() -> None:
    a, b = next(simulate(np.random.default_rng(10), 1, seed_sd=0.0))
    found = pw.design_of(a, b)
    assert found.n_problems == (TINY,) * 7 and found.n_seeds == 3
    assert found.problem_var == pytest.approx([m * (1 - m) for m in MEANS], abs=0.03)
    assert found.correlation == pytest.approx([CORRELATION] * 7, abs=0.08)
    assert max(found.problem_share) < 0.05 and found.seed_var < 1e-4
    # the noise of the difference as the truth; the pilot's own SE reproduced (its seed part,
    # 2 df, is what it is: a pilot of 3 seeds tells little about seed_var)
    assert found.components().noise == pytest.approx(design().components().noise, rel=0.1)
    observed = st.components(st.difference_cell(a, b))[st.AVG]
    assert pw.plan(found).se == pytest.approx(observed.se, rel=0.03)


# -- (c) coverage of a cell's interval ---------------------------------------------------------

def test_a_cells_interval_covers_the_truth() -> None:
    """(c) 95% intervals of a cell's AVG and of one benchmark hold the population accuracy
    in 95% of experiments (analytic SE: 1500 experiments; the bootstrap's: 300)."""
    rng = np.random.default_rng(11)
    truth = {st.AVG: float(np.mean(MEANS)), NAMES[0]: MEANS[0]}
    hits: dict[str, list[bool]] = {"analytic": [], "bootstrap": [], NAMES[0]: []}
    for i, (_, b) in enumerate(simulate(rng, 1500, problems=300, seed_sd=0.005)):
        est = st.cell_estimates(b, n_boot=0)
        hits["analytic"].append(est[st.AVG].lo <= truth[st.AVG] <= est[st.AVG].hi)
        hits[NAMES[0]].append(est[NAMES[0]].lo <= truth[NAMES[0]] <= est[NAMES[0]].hi)
        if i < 300:
            boot = st.cell_estimates(b, n_boot=300, seed=i)[st.AVG]
            hits["bootstrap"].append(boot.lo <= truth[st.AVG] <= boot.hi)
    for key, found in hits.items():
        rate, se = _rate(found, 0.95)
        assert abs(rate - 0.95) <= 3 * se, (key, rate)


# -- (c') intervals inside their range, with their coverage near 0, 0.5 and 1 -----------------

def _one_benchmark(rng: np.random.Generator, n: int, mean: float, problems: int = 300,
                   seeds: int = 3) -> np.ndarray:
    """[n, seeds, problems] 0/1 scores of one benchmark whose population accuracy is `mean`:
    U-shaped solve rates, and a seed effect of sd 0.005 (the other simulations'), at most
    0.2 min(mean, 1 - mean) so that it never crosses an end and the truth stays `mean`)."""
    rate = rng.beta(mean * CONCENTRATION, (1 - mean) * CONCENTRATION, size=(n, 1, problems))
    level = rng.normal(0, min(0.005, 0.2 * min(mean, 1 - mean)), size=(n, seeds, 1))
    rate = np.clip(_shift(rate, level, mean), 0, 1)
    return (rng.random((n, seeds, problems)) < rate).astype(float)


def _t_covers(est: float, se: float, df: float, truth: float) -> bool:
    q = float(sps.t.ppf(0.975, df))
    return est - q * se <= truth <= est + q * se


def test_intervals_stay_in_their_range_and_cover_near_0_05_and_1() -> None:
    """(c') A benchmark's 95% interval (3 seeds x 300 problems) lies in [0, 1] and covers its
    population accuracy 95% of the time at 0.01, 0.03, 0.5, 0.97 and 0.99; a paired
    difference's lies in [-1, 1] and covers at -0.98, 0 and +0.98. The plain t interval
    beside it (what the report printed before) crosses the ends and under-covers there.
    1000 experiments each (analytic SE); the table is printed (pytest -rP)."""
    rng = np.random.default_rng(5)
    n = 1000
    rows = []
    for mean in (0.01, 0.03, 0.5, 0.97, 0.99):
        cells = _one_benchmark(rng, n, mean)
        bounded, plain, outside = [], [], 0
        for y in cells:
            est = st.cell_estimates({"b": y, "c": y}, n_boot=0)["b"]
            assert 0.0 <= est.lo <= est.estimate <= est.hi <= 1.0, (mean, est)
            bounded.append(est.lo <= mean <= est.hi)
            plain.append(_t_covers(est.estimate, est.se, est.df, mean))
            q = float(sps.t.ppf(0.975, est.df))
            outside += est.estimate - q * est.se < 0 or est.estimate + q * est.se > 1
        rows.append((f"accuracy {mean}", np.mean(bounded), np.mean(plain), outside / n))
        rate, se = _rate(bounded, 0.95)
        assert abs(rate - 0.95) <= 3 * se, (mean, rate)
    for a_mean, b_mean in ((0.99, 0.01), (0.5, 0.5), (0.01, 0.99)):
        a_cells, b_cells = _one_benchmark(rng, n, a_mean), _one_benchmark(rng, n, b_mean)
        truth = a_mean - b_mean
        bounded, plain, outside = [], [], 0
        for ya, yb in zip(a_cells, b_cells, strict=True):
            d = st.paired_difference({"b": ya, "c": ya}, {"b": yb, "c": yb}, n_boot=0)["b"]
            assert -1.0 <= d.lo <= d.estimate <= d.hi <= 1.0, (truth, d)
            bounded.append(d.lo <= truth <= d.hi)
            plain.append(_t_covers(d.estimate, d.se, d.df, truth))
            q = float(sps.t.ppf(0.975, d.df))
            outside += d.estimate - q * d.se < -1 or d.estimate + q * d.se > 1
        rows.append((f"difference {truth:+.2f}", np.mean(bounded), np.mean(plain), outside / n))
        rate, se = _rate(bounded, 0.95)
        assert abs(rate - 0.95) <= 3 * se, (truth, rate)
    print("95% intervals, 3 seeds x 300 problems, 1000 experiments each")
    print("| truth | bounded (Wilson, effective n, t quantile) | plain t | plain t past an end |")
    print("| --- | --- | --- | --- |")
    for name, b, p, out in rows:
        print(f"| {name} | {b:.3f} | {p:.3f} | {out:.3f} |")


# -- aggregates and the probability of improvement ---------------------------------------------

def test_iqm_and_probability_of_improvement() -> None:
    a, b = next(simulate(np.random.default_rng(12), 1, problems=300, effect=0.05))
    est = st.cell_estimates(a, n_boot=500)
    means = [np.mean(a[n]) for n in NAMES]
    assert est[st.IQM].estimate == pytest.approx(sps.trim_mean(means, 0.25))
    assert est[st.IQM].lo < est[st.IQM].estimate < est[st.IQM].hi
    assert est[st.AVG].estimate == pytest.approx(np.mean(means))
    same = st.paired_difference(a, a, n_boot=500)
    for d in same.values():
        assert d.estimate == 0 and d.se == 0 and d.prob_improvement == 0.5
        assert d.p in (1.0, None)
    gain = st.paired_difference(a, b, n_boot=500)
    prob = gain[st.AVG].prob_improvement
    assert prob is not None and prob > 0.9 and gain[st.AVG].estimate > 0
    iqm_a = sps.trim_mean([np.mean(a[n]) for n in NAMES], 0.25)
    iqm_b = sps.trim_mean([np.mean(b[n]) for n in NAMES], 0.25)
    assert gain[st.IQM].estimate == pytest.approx(iqm_a - iqm_b) and gain[st.IQM].p is None
    # the agents' mean gain is one paired difference of their mean cells
    a2, b2 = next(simulate(np.random.default_rng(13), 1, problems=300, effect=0.05))
    both = st.paired_difference(st.mean_cell([a, a2]), st.mean_cell([b, b2]), n_boot=0)
    each = [st.paired_difference(x, y, n_boot=0)[st.AVG].estimate for x, y in ((a, b), (a2, b2))]
    assert both[st.AVG].estimate == pytest.approx(np.mean(each))


# -- verdicts ----------------------------------------------------------------------------------

def _diff(estimate: float, se: float, df: float = 2.0) -> st.Difference:
    p = float(2 * sps.t.sf(abs(estimate) / se, df))
    return st.Difference(st.AVG, estimate, se, estimate - 4.3 * se, estimate + 4.3 * se, df, p,
                         None, se, 3, 8400)


def test_holm() -> None:
    assert vd.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert vd.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert vd.holm([]).size == 0


def test_verdicts_say_what_the_noise_allows() -> None:
    strong = [_diff(0.05, 0.002) for _ in range(4)]
    weak = [_diff(0.006, 0.004), _diff(-0.002, 0.004)]
    claim = vd.judge("HACPO > GSPOx2 for every agent",
                     [(f"agent {k}", d) for k, d in enumerate(strong + weak)])
    assert [c.verdict for c in claim.comparisons] == ["supported"] * 4 + ["inconclusive"] * 2
    assert claim.verdict.startswith("supported for 4 of 6, inconclusive for 2 (MDE ")
    weak_mde = claim.comparisons[-1].mde
    assert weak_mde is not None and weak_mde > st.mde(0.004, 2)  # taken at alpha / 6
    # four equal p-values: the smallest step, 6 p, carries over to all four
    assert claim.comparisons[0].p_adjusted == pytest.approx(6 * (strong[0].p or 0), rel=1e-6)
    one = vd.judge("the average gain", [("mean of the agents", _diff(0.0062, 0.004))])
    assert one.verdict.startswith("inconclusive (MDE ") and "gain" not in one.verdict
    line = one.comparisons[0].text()
    assert line.startswith("mean of the agents: +0.62 pt [") and "inconclusive (MDE" in line
    against = vd.judge("A > B", [("x", _diff(-0.05, 0.002)), ("y", None)])
    assert against.verdict == "contradicted for 1 of 1, 1 not testable"
    assert against.comparisons[1].text() == "y: not testable (runs missing)"
    assert vd.judge("A > B", [("x", None)]).verdict == "not testable (runs missing)"
    assert vd.judge("A > B", [("x", _diff(0.05, 0.002))]).verdict == "supported"
    with pytest.raises(ValueError, match="p-value"):
        vd.judge("IQM", [("x", st.Difference(st.IQM, 0.1, 0.01, 0, 0.2, math.inf, None, 0.9,
                                             None, 3, 10))])


# -- Table 6: per-seed numbers only ------------------------------------------------------------

def _published(model: str, method: str) -> dict[int, float]:
    rows = paper("seeds")
    rows = rows[(rows["model"] == model) & (rows["method"] == method)]
    return {int(r.seed): float(r.value) for r in rows.itertuples()}


def test_the_papers_seeds_through_the_same_lens() -> None:
    hacpo, x2 = _published("qwen3-1.7b-base", "hacpo"), _published("qwen3-1.7b-base", "gspo_x2")
    diff = ss.paired_seed_difference(hacpo, x2)
    seeds = sorted(hacpo)
    a, b = [hacpo[s] for s in seeds], [x2[s] for s in seeds]
    ref = sps.ttest_rel(a, b)
    assert diff.n == 5 and diff.estimate == pytest.approx(0.0308)
    assert diff.p == pytest.approx(ref.pvalue)
    # mid-range the bounded interval is the t interval to a hundredth of its width
    lo, hi = ref.confidence_interval(0.95)
    assert (diff.lo, diff.hi) == (pytest.approx(lo, abs=1e-2 * (hi - lo)),
                                  pytest.approx(hi, abs=1e-2 * (hi - lo)))
    se = float(np.std(np.subtract(a, b), ddof=1)) / math.sqrt(5)
    assert diff.mde == pytest.approx(st.mde(se, 4))
    assert "p 0.00031" in diff.text() and "(5 seeds)" in diff.text()
    mean = ss.seed_mean(a)
    t_lo, t_hi = sps.t.interval(0.95, 4, loc=np.mean(a), scale=sps.sem(a))
    assert (mean.lo, mean.hi) == (pytest.approx(t_lo, abs=1e-2 * (t_hi - t_lo)),
                                  pytest.approx(t_hi, abs=1e-2 * (t_hi - t_lo)))
    # the paper gives no per-seed GSPOx2 for Qwen3-4B-Base: no samples, never 0
    none = ss.paired_seed_difference(_published("qwen3-4b-base", "hacpo"),
                                     _published("qwen3-4b-base", "gspo_x2"))
    assert none.estimate is None and none.text() == "no samples"
    assert ss.seed_mean([]).text() == "95% CI: no samples"
    assert ss.paired_seed_difference({0: 0.5}, {0: 0.4}).stats_text() == "one seed: no interval"


def test_bootstrap_counts_are_the_drawn_problems() -> None:
    """The cached counts give each replicate the mean of the problems its draws name."""
    from analysis.stats import _draw_counts, _draws

    values = np.random.default_rng(1).random(37)
    draws = _draws(0, 2, 7, 37, 50)
    counts = _draw_counts(0, 2, 7, 37, 50)
    assert counts.sum(1).tolist() == [37.0] * 50
    assert np.allclose(counts @ values / 37, values[draws].mean(1), rtol=0, atol=1e-15)
    assert not np.array_equal(draws, _draws(0, 3, 7, 37, 50))  # each benchmark its own stream
