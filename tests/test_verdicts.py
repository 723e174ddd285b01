"""analysis.verdicts, value by value: a comparison's line, Holm's adjustment, a claim's
verdicts at the significance boundary, and every shape of the claim-level sentence.

Every expected value here is written out or computed from the formula in the test (Holm's
k-th smallest times m - k + 1, `analysis.stats.mde` called with explicit arguments), never
by the function under test. tests/test_stats.py checks the same module against simulations.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from analysis import stats as st
from analysis import verdicts as vd
from analysis.verdicts import Comparison

SUP, CON, INC, NT = "supported", "contradicted", "inconclusive", "not testable"


def _diff(estimate: float, p: float | None, *, se: float = 0.01, df: float = math.inf,
          lo: float = -0.031, hi: float = 0.047, prob: float | None = 0.83) -> st.Difference:
    """A Difference with the numbers a verdict reads set by hand; its own alpha and power
    (0.2, 0.5) are not the claim's, so an MDE taken from them would show."""
    return st.Difference(st.AVG, estimate, se, lo, hi, df, p, prob, se, 3, 8400, 0.2, 0.5)


def _c(verdict: str, mde: float | None = None, label: str = "x") -> Comparison:
    return Comparison(label, verdict, 0.01, -0.01, 0.03, 0.2, 0.4, None, mde)


# -- Comparison.text ---------------------------------------------------------------------------

def test_text_without_an_estimate_is_the_label_and_the_verdict() -> None:
    """No estimate: 'label: verdict', the reason in parentheses only when there is one."""
    assert Comparison("a vs b", NT).text() == "a vs b: not testable"
    assert Comparison("a vs b", NT, reason="runs missing").text() == \
        "a vs b: not testable (runs missing)"
    # the numbers are not read without an estimate, whatever else is set
    assert Comparison("a vs b", INC, None, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6).text() == \
        "a vs b: inconclusive"


def test_text_with_every_number_in_points() -> None:
    """Estimate and interval in points (x100, signed, 2 decimals), p and Holm's p to 2
    significant digits, P(A > B) to 2 decimals, then the verdict; no MDE unless inconclusive."""
    c = Comparison("A vs B", SUP, 0.01234, 0.00456, 0.02012, 0.0123456, 0.0370368, 0.987, 0.009)
    assert c.text() == ("A vs B: +1.23 pt [+0.46, +2.01], p 0.012 (Holm 0.037), "
                        "P(A > B) 0.99: supported")
    assert c.text(100.0, "pt") == c.text()


def test_text_of_an_inconclusive_comparison_gives_its_mde() -> None:
    """Inconclusive with an MDE: ' (MDE x.x pt)' at the end, one decimal, scaled like the
    estimate; negative numbers keep their sign; no P(A > B) when it is None."""
    c = Comparison("g", INC, 0.00623, -0.00414, 0.01657, 0.2345, 0.469, None, 0.01344)
    assert c.text() == "g: +0.62 pt [-0.41, +1.66], p 0.23 (Holm 0.47): inconclusive (MDE 1.3 pt)"
    neg = Comparison("h", CON, -0.05432, -0.07211, -0.03653, 0.00012, 0.00024, 0.012, 0.02)
    assert neg.text() == ("h: -5.43 pt [-7.21, -3.65], p <0.001 (Holm <0.001), P(A > B) 0.01: "
                          "contradicted")


def test_text_shows_no_mde_when_there_is_none_or_the_verdict_is_not_inconclusive() -> None:
    """An inconclusive comparison without an MDE ends at its verdict; a supported one with an
    MDE does not show it."""
    assert Comparison("g", INC, 0.00623, -0.00414, 0.01657, 0.2345, 0.469).text() == \
        "g: +0.62 pt [-0.41, +1.66], p 0.23 (Holm 0.47): inconclusive"
    assert Comparison("g", SUP, 0.00623, -0.00414, 0.01657, 0.2345, 0.469, None, 0.0134).text() \
        == "g: +0.62 pt [-0.41, +1.66], p 0.23 (Holm 0.47): supported"


def test_text_marks_missing_bounds_and_p_values() -> None:
    """A bound that is None reads '?', a p-value that is None '-'."""
    c = Comparison("g", INC, 0.00623, None, None, None, None, None, 0.01344)
    assert c.text() == "g: +0.62 pt [?, ?], p - (Holm -): inconclusive (MDE 1.3 pt)"
    half = Comparison("g", SUP, 0.00623, None, 0.01657, 0.0004, None)
    assert half.text() == "g: +0.62 pt [?, +1.66], p <0.001 (Holm -): supported"


@pytest.mark.parametrize("p, shown", [
    (0.0004, "<0.001"), (0.00099, "<0.001"), (0.001, "0.001"), (0.0012345, "0.0012"),
    (0.23456, "0.23"), (0.05, "0.05"), (1.0, "1"), (0.0, "<0.001"),
])
def test_text_p_values_below_one_in_a_thousand_read_as_a_bound(p: float, shown: str) -> None:
    """p < 0.001 reads '<0.001'; p = 0.001 itself and above: 2 significant digits."""
    assert Comparison("g", SUP, 0.01, 0.0, 0.02, p, p).text() == \
        f"g: +1.00 pt [+0.00, +2.00], p {shown} (Holm {shown}): supported"


def test_text_in_another_unit() -> None:
    """unit and unit_name scale and name the estimate, the bounds and the MDE."""
    c = Comparison("g", INC, 0.5, 0.25, 0.75, 0.3, 0.6, 0.75, 1.26)
    assert c.text(unit=1.0, unit_name="acc") == \
        "g: +0.50 acc [+0.25, +0.75], p 0.3 (Holm 0.6), P(A > B) 0.75: inconclusive (MDE 1.3 acc)"
    assert c.text(10.0, "dp") == \
        "g: +5.00 dp [+2.50, +7.50], p 0.3 (Holm 0.6), P(A > B) 0.75: inconclusive (MDE 12.6 dp)"
    assert c.text() == ("g: +50.00 pt [+25.00, +75.00], p 0.3 (Holm 0.6), P(A > B) 0.75: "
                        "inconclusive (MDE 126.0 pt)")


def test_p_and_num_helpers() -> None:
    """_p: '-' for None, '<0.001' below 0.001, else 2 significant digits; _num: '?' for None,
    else the value times the unit, signed, 2 decimals."""
    assert vd._p(None) == "-"
    assert vd._p(0.000999) == "<0.001"
    assert vd._p(0.001) == "0.001"
    assert vd._p(0.0456) == "0.046"
    assert vd._num(None, 100.0) == "?"
    assert vd._num(0.01234, 100.0) == "+1.23"
    assert vd._num(-0.5, 1.0) == "-0.50"
    assert vd._num(0.0, 100.0) == "+0.00"


def test_comparison_and_claim_verdict_defaults() -> None:
    """A Comparison holds nothing but its label and verdict unless told; a ClaimVerdict is
    at alpha 0.05 with Holm's correction and no comparisons."""
    c = Comparison("x", NT)
    assert (c.estimate, c.lo, c.hi, c.p, c.p_adjusted, c.prob_improvement, c.mde, c.reason) == \
        (None, None, None, None, None, None, None, "")
    v = vd.ClaimVerdict("claim", "supported")
    assert (v.comparisons, v.alpha, v.correction) == ([], 0.05, "Holm")


# -- holm ---------------------------------------------------------------------------------------

def test_holm_multiplies_the_kth_smallest_by_m_minus_k_plus_1() -> None:
    """[0.02, 0.01, 0.04]: sorted 0.01, 0.02, 0.04 times 3, 2, 1 = 0.03, 0.04, 0.04, given
    back in the input's order."""
    out = vd.holm([0.02, 0.01, 0.04])
    assert out == pytest.approx([0.04, 0.03, 0.04], rel=1e-12)
    assert vd.holm([0.001, 0.002, 0.003, 0.004]) == \
        pytest.approx([0.004, 0.006, 0.006, 0.006], rel=1e-12)


def test_holm_raises_a_later_step_to_the_earlier_one() -> None:
    """Steps 3 * 0.01 = 0.03, 2 * 0.011 = 0.022, 0.5: the second is raised to 0.03 so the
    adjusted p-values keep the order of the raw ones."""
    assert vd.holm([0.01, 0.011, 0.5]) == pytest.approx([0.03, 0.03, 0.5], rel=1e-12)
    assert vd.holm([0.5, 0.011, 0.01]) == pytest.approx([0.5, 0.03, 0.03], rel=1e-12)


def test_holm_with_ties() -> None:
    """Equal p-values get the same adjusted value, the larger of their steps: [0.04, 0.01,
    0.2, 0.01] -> steps 4 * 0.01, 3 * 0.01, 2 * 0.04, 0.2 -> 0.04, 0.04, 0.08, 0.2."""
    assert vd.holm([0.04, 0.01, 0.2, 0.01]) == pytest.approx([0.08, 0.04, 0.2, 0.04], rel=1e-12)
    assert vd.holm([0.01, 0.01, 0.04]) == pytest.approx([0.03, 0.03, 0.04], rel=1e-12)
    assert vd.holm([0.3, 0.3]) == pytest.approx([0.6, 0.6], rel=1e-12)


def test_holm_caps_at_one() -> None:
    """A step above 1 is 1, and so is every later one raised to it."""
    assert vd.holm([0.001, 0.6, 0.7]) == pytest.approx([0.003, 1.0, 1.0], rel=1e-12)
    assert vd.holm([0.6, 0.7]) == pytest.approx([1.0, 1.0], rel=1e-12)
    assert vd.holm([0.4, 0.45]).tolist() == pytest.approx([0.8, 0.8], rel=1e-12)  # under 1: kept


def test_holm_of_one_value_and_of_none() -> None:
    """One p-value is its own adjustment (at most 1); no p-values give an empty float array."""
    assert vd.holm([0.3]).tolist() == [0.3]
    assert vd.holm([0.05]).tolist() == [0.05]
    assert vd.holm([1.5]).tolist() == [1.0]
    empty = vd.holm([])
    assert isinstance(empty, np.ndarray) and empty.shape == (0,) and empty.dtype == np.float64


def test_holm_returns_floats_whatever_the_input() -> None:
    """Integers and tuples in, a float array out with the input's length and order."""
    out = vd.holm((1, 0))
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    assert out.tolist() == [1.0, 0.0]
    half = vd.holm([0, 0.25])
    assert half.dtype == np.float64 and half.tolist() == [0.0, 0.25]


# -- judge --------------------------------------------------------------------------------------

def test_judge_fills_every_field_of_a_comparison() -> None:
    """Each tested comparison carries the Difference's estimate, interval, p, P(A > B) and seeds,
    its Holm p within the family and its MDE at alpha / m and the claim's power."""
    a = _diff(0.02, 0.004, se=0.006, df=4.0, lo=0.003, hi=0.037, prob=0.97)
    b = _diff(-0.001, 0.3, se=0.007, df=5.0, lo=-0.02, hi=0.018, prob=0.41)
    v = vd.judge("A > B for every agent", [("agent 0", a), ("agent 1", b)])
    assert v.comparisons == [
        Comparison("agent 0", SUP, 0.02, 0.003, 0.037, 0.004, 2 * 0.004, 0.97,
                   st.mde(0.006, 4.0, alpha=0.05 / 2, power=0.8), n_seeds=3),
        Comparison("agent 1", INC, -0.001, -0.02, 0.018, 0.3, 0.3, 0.41,
                   st.mde(0.007, 5.0, alpha=0.05 / 2, power=0.8), n_seeds=3),
    ]
    assert (v.claim, v.alpha, v.correction) == ("A > B for every agent", 0.05, "Holm")


def test_judge_keeps_the_input_order() -> None:
    """Comparisons come back in the order given, not sorted by p."""
    v = vd.judge("c", [("late", _diff(0.01, 0.3)), ("early", _diff(0.01, 0.001)),
                       ("mid", _diff(0.01, 0.04))])
    assert [c.label for c in v.comparisons] == ["late", "early", "mid"]
    assert [c.p_adjusted for c in v.comparisons] == pytest.approx([0.3, 0.003, 0.08], rel=1e-12)
    assert [c.verdict for c in v.comparisons] == [INC, SUP, INC]


def test_judge_significant_exactly_at_alpha() -> None:
    """p_adj == alpha is significant; just above is not."""
    assert vd.judge("c", [("x", _diff(0.01, 0.05))]).comparisons[0].verdict == SUP
    assert vd.judge("c", [("x", _diff(0.01, 0.0500001))]).comparisons[0].verdict == INC
    # two of them: 2 * 0.025 is 0.05 to the last bit
    two = vd.judge("c", [("x", _diff(0.01, 0.025)), ("y", _diff(0.01, 0.5))])
    assert [c.p_adjusted for c in two.comparisons] == [0.05, 0.5]
    assert [c.verdict for c in two.comparisons] == [SUP, INC]
    assert two.verdict == "supported for 1 of 2, inconclusive for 1 (MDE 3.1 pt)"
    above = vd.judge("c", [("x", _diff(0.01, 0.0250001)), ("y", _diff(0.01, 0.5))])
    assert [c.verdict for c in above.comparisons] == [INC, INC]


def test_judge_direction_of_a_significant_difference() -> None:
    """Significant and > 0: supported; < 0: contradicted; exactly 0 counts as not in the
    claimed direction: contradicted."""
    def verdict(estimate: float) -> str:
        return vd.judge("c", [("x", _diff(estimate, 0.001))]).comparisons[0].verdict

    assert verdict(0.01) == SUP
    assert verdict(1e-9) == SUP
    assert verdict(-0.01) == CON
    assert verdict(0.0) == CON
    # not significant: inconclusive whatever the sign
    assert vd.judge("c", [("x", _diff(-0.01, 0.2))]).comparisons[0].verdict == INC


def test_judge_default_alpha_is_five_percent() -> None:
    """Without alpha: 0.05, in the test and in the ClaimVerdict."""
    v = vd.judge("c", [("x", _diff(0.01, 0.2))])
    assert v.alpha == 0.05 and v.comparisons[0].verdict == INC
    assert vd.judge("c", [("x", _diff(0.01, 0.051))]).comparisons[0].verdict == INC
    assert vd.judge("c", [("x", _diff(0.01, 0.049))]).comparisons[0].verdict == SUP


def test_judge_at_another_alpha() -> None:
    """alpha sets the threshold, the MDE's level (alpha / m) and the ClaimVerdict's alpha."""
    v = vd.judge("c", [("x", _diff(0.01, 0.1)), ("y", _diff(0.01, 0.3))], alpha=0.2)
    assert v.alpha == 0.2
    assert [c.p_adjusted for c in v.comparisons] == pytest.approx([0.2, 0.3], rel=1e-12)
    assert [c.verdict for c in v.comparisons] == [SUP, INC]
    assert v.comparisons[0].mde == st.mde(0.01, math.inf, alpha=0.1, power=0.8)
    assert vd.judge("c", [("x", _diff(0.01, 0.2))], alpha=0.01).comparisons[0].verdict == INC


def test_judge_mde_at_alpha_over_m_and_the_power() -> None:
    """The MDE is `mde(se, df, alpha=alpha / m, power=power)` with the Difference's se and df
    (not the Difference's own alpha and power)."""
    diffs = [("a", _diff(0.01, 0.5, se=0.004, df=3.0)), ("b", _diff(0.01, 0.6, se=0.005, df=7.0)),
             ("c", _diff(0.01, 0.7, se=0.006, df=math.inf))]
    v = vd.judge("c", diffs, alpha=0.1, power=0.9)
    assert [c.mde for c in v.comparisons] == [
        st.mde(0.004, 3.0, alpha=0.1 / 3, power=0.9), st.mde(0.005, 7.0, alpha=0.1 / 3, power=0.9),
        st.mde(0.006, math.inf, alpha=0.1 / 3, power=0.9)]
    # large df: (z_{1 - alpha / 2m} + z_power) * se, by hand with scipy's normal quantiles
    z = float(sps.norm.ppf(1 - 0.1 / 6) + sps.norm.ppf(0.9))
    assert v.comparisons[2].mde == pytest.approx(z * 0.006, rel=1e-9)
    # defaults: alpha 0.05, power 0.8; m = 2: z_{0.9875} + z_{0.8} = 3.0830
    two = vd.judge("c", [("a", _diff(0.01, 0.5)), ("b", _diff(0.01, 0.6))])
    assert [c.mde for c in two.comparisons] == pytest.approx([0.030830, 0.030830], abs=1e-6)
    assert two.comparisons[0].mde == st.mde(0.01, math.inf, alpha=0.025, power=0.8)
    one = vd.judge("c", [("a", _diff(0.01, 0.5, df=4.0))])
    assert one.comparisons[0].mde == st.mde(0.01, 4.0, alpha=0.05, power=0.8)
    assert one.comparisons[0].mde != st.mde(0.01, math.inf, alpha=0.05, power=0.8)


def test_judge_power_changes_only_the_mde() -> None:
    """A higher power asks for a larger MDE: at m = 1, z_{0.975} + z_{0.9} = 3.2415 SE."""
    v = vd.judge("c", [("x", _diff(0.01, 0.5, se=0.1))], power=0.9)
    assert v.comparisons[0].mde == pytest.approx(0.32415, abs=1e-5)
    assert v.comparisons[0].verdict == INC
    assert v.verdict == "inconclusive (MDE 32.4 pt)"


def test_judge_missing_comparisons_are_not_testable() -> None:
    """None: 'not testable' with the `missing` reason and no numbers, in its place; m, the
    Holm factor and the MDE's alpha / m count only the tested comparisons."""
    v = vd.judge("c", [("a", None), ("b", _diff(0.01, 0.02)), ("c", None),
                       ("d", _diff(0.01, 0.03))])
    assert v.comparisons[0] == Comparison("a", NT, reason="runs missing")
    assert v.comparisons[2] == Comparison("c", NT, reason="runs missing")
    assert [c.label for c in v.comparisons] == ["a", "b", "c", "d"]
    # m = 2: sorted 0.02, 0.03 times 2, 1 = 0.04, 0.03 -> 0.04, 0.04
    assert [c.p_adjusted for c in v.comparisons[1::2]] == pytest.approx([0.04, 0.04], rel=1e-12)
    mde2 = st.mde(0.01, math.inf, alpha=0.05 / 2, power=0.8)
    assert [c.mde for c in v.comparisons[1::2]] == [mde2, mde2]
    assert v.verdict == "supported for 2 of 2, 2 not testable"
    assert v.comparisons[0].text() == "a: not testable (runs missing)"


def test_judge_missing_reason_is_what_the_caller_says() -> None:
    """`missing` is each missing comparison's reason."""
    v = vd.judge("c", [("a", None), ("b", _diff(0.01, 0.5))], missing="no seed 3")
    assert v.comparisons[0] == Comparison("a", NT, reason="no seed 3")
    assert v.comparisons[0].text() == "a: not testable (no seed 3)"
    assert v.comparisons[1].verdict == INC
    assert v.comparisons[1].mde == st.mde(0.01, math.inf, alpha=0.05, power=0.8)


def test_judge_with_every_comparison_missing() -> None:
    """Nothing tested: every comparison not testable and the claim too."""
    v = vd.judge("c", [("a", None), ("b", None)])
    assert v.comparisons == [Comparison("a", NT, reason="runs missing"),
                             Comparison("b", NT, reason="runs missing")]
    assert v.verdict == "not testable (runs missing)"
    assert vd.judge("c", []).verdict == "not testable (runs missing)"


def test_judge_needs_a_p_value_for_every_tested_comparison() -> None:
    """A Difference without a p-value (an IQM's) is a ValueError naming the claim."""
    iqm = st.Difference(st.IQM, 0.1, 0.01, 0.0, 0.2, math.inf, None, 0.9, None, 3, 10)
    with pytest.raises(ValueError) as err:
        vd.judge("IQM gain", [("ok", _diff(0.01, 0.01)), ("none", None), ("iqm", iqm)])
    assert str(err.value) == "IQM gain: every comparison needs a p-value (AVG or a benchmark)"


def test_judge_unit_reaches_the_sentence() -> None:
    """unit and unit_name scale and name the MDE in the claim's sentence; the default is
    points (x100, 'pt')."""
    pairs = [("x", _diff(0.01, 0.5, se=0.1))]  # MDE (z_0.975 + z_0.8) * 0.1 = 0.2802
    assert vd.judge("c", pairs).verdict == "inconclusive (MDE 28.0 pt)"
    assert vd.judge("c", pairs, unit=1.0, unit_name="acc").verdict == "inconclusive (MDE 0.3 acc)"
    assert vd.judge("c", pairs, unit=10.0).verdict == "inconclusive (MDE 2.8 pt)"
    assert vd.judge("c", pairs, unit_name="%").verdict == "inconclusive (MDE 28.0 %)"


def test_judge_sentences() -> None:
    """The claim's sentence from judge: all supported, a contradiction with a missing run."""
    strong = [(f"agent {k}", _diff(0.05, 0.0001)) for k in range(3)]
    assert vd.judge("c", strong).verdict == "supported (3 of 3)"
    assert vd.judge("c", strong[:1]).verdict == "supported"
    against = vd.judge("c", [("x", _diff(-0.05, 0.0001)), ("y", None)])
    assert against.verdict == "contradicted for 1 of 1, 1 not testable"


# -- summarize ----------------------------------------------------------------------------------

def test_summarize_when_every_comparison_agrees() -> None:
    """One comparison: the bare verdict; several: 'verdict (m of m)'."""
    assert vd.summarize([_c(SUP)]) == "supported"
    assert vd.summarize([_c(SUP), _c(SUP)]) == "supported (2 of 2)"
    assert vd.summarize([_c(SUP)] * 3) == "supported (3 of 3)"
    assert vd.summarize([_c(CON)] * 3) == "contradicted (3 of 3)"
    assert vd.summarize([_c(CON)]) == "contradicted"
    assert vd.summarize([_c(INC, 0.013)] * 2) == "inconclusive (2 of 2) (MDE 1.3 pt)"
    assert vd.summarize([_c(INC, 0.013)]) == "inconclusive (MDE 1.3 pt)"


def test_summarize_a_mix_names_m_once() -> None:
    """A mix: 'verdict for k of m' for the first part, 'verdict for k' after, in the order
    supported, contradicted, inconclusive whatever the input's."""
    assert vd.summarize([_c(SUP), _c(SUP), _c(INC, 0.013)]) == \
        "supported for 2 of 3, inconclusive for 1 (MDE 1.3 pt)"
    mix = [_c(INC, 0.012), _c(CON), _c(SUP), _c(INC, 0.019), _c(INC, 0.015)]
    assert vd.summarize(mix) == \
        "supported for 1 of 5, contradicted for 1, inconclusive for 3 (MDE 1.2-1.9 pt)"
    assert vd.summarize([_c(INC, 0.013), _c(CON), _c(CON)]) == \
        "contradicted for 2 of 3, inconclusive for 1 (MDE 1.3 pt)"
    assert vd.summarize([_c(CON), _c(SUP)]) == "supported for 1 of 2, contradicted for 1"


def test_summarize_counts_the_not_testable() -> None:
    """Missing comparisons are left out of m and counted at the end: a verdict shared by every
    tested comparison then reads 'verdict for k of m' (not 'verdict (m of m)')."""
    assert vd.summarize([_c(CON), _c(NT)]) == "contradicted for 1 of 1, 1 not testable"
    assert vd.summarize([_c(NT), _c(SUP), _c(NT)]) == "supported for 1 of 1, 2 not testable"
    assert vd.summarize([_c(INC, 0.013), _c(NT), _c(INC, 0.013)]) == \
        "inconclusive for 2 of 2 (MDE 1.3 pt), 1 not testable"
    assert vd.summarize([_c(SUP), _c(INC, 0.013), _c(NT)]) == \
        "supported for 1 of 2, inconclusive for 1 (MDE 1.3 pt), 1 not testable"


def test_summarize_with_nothing_tested() -> None:
    """No tested comparison: 'not testable (runs missing)'."""
    assert vd.summarize([_c(NT)]) == "not testable (runs missing)"
    assert vd.summarize([_c(NT), _c(NT)]) == "not testable (runs missing)"
    assert vd.summarize([]) == "not testable (runs missing)"


def test_summarize_mde_span() -> None:
    """The inconclusive ones' MDEs: one value when they are within 0.05 of each other (in the
    unit), else 'min-max'; the middle ones do not show."""
    assert vd.summarize([_c(INC, 0.0130), _c(INC, 0.0134)]) == "inconclusive (2 of 2) (MDE 1.3 pt)"
    assert vd.summarize([_c(INC, 0.0134), _c(INC, 0.0120), _c(INC, 0.0190), _c(INC, 0.0150)]) \
        == "inconclusive (4 of 4) (MDE 1.2-1.9 pt)"
    assert vd.summarize([_c(INC, 0.0160), _c(INC, 0.0120)]) == "inconclusive (2 of 2) (MDE 1.2-1.6 pt)"
    # exactly 0.05 apart (0.152 - 0.102 is 0.05 to the last bit): a range
    assert vd.summarize([_c(INC, 0.102), _c(INC, 0.152)], 1.0, "acc") == \
        "inconclusive (2 of 2) (MDE 0.1-0.2 acc)"
    assert vd.summarize([_c(INC, 0.102), _c(INC, 0.1519)], 1.0, "acc") == \
        "inconclusive (2 of 2) (MDE 0.1 acc)"


def test_summarize_mde_only_of_the_inconclusive_that_have_one() -> None:
    """Supported and contradicted comparisons' MDEs are not shown; inconclusive ones without an
    MDE are counted but give no MDE text."""
    assert vd.summarize([_c(SUP, 0.05), _c(INC, 0.013)]) == \
        "supported for 1 of 2, inconclusive for 1 (MDE 1.3 pt)"
    assert vd.summarize([_c(CON, 0.05), _c(SUP, 0.02)]) == "supported for 1 of 2, contradicted for 1"
    assert vd.summarize([_c(INC)]) == "inconclusive"
    assert vd.summarize([_c(SUP), _c(INC)]) == "supported for 1 of 2, inconclusive for 1"
    assert vd.summarize([_c(INC), _c(INC, 0.013)]) == "inconclusive (2 of 2) (MDE 1.3 pt)"
    assert vd.summarize([_c(INC, 0.021), _c(INC), _c(INC, 0.013)]) == \
        "inconclusive (3 of 3) (MDE 1.3-2.1 pt)"


def test_summarize_scales_the_mde_by_the_unit() -> None:
    """The MDE is shown times `unit`, named `unit_name`; by default points (x100, 'pt')."""
    assert vd.summarize([_c(INC, 0.1)]) == "inconclusive (MDE 10.0 pt)"
    assert vd.summarize([_c(INC, 0.1)], 100.0, "pt") == "inconclusive (MDE 10.0 pt)"
    assert vd.summarize([_c(INC, 0.1)], unit=1.0) == "inconclusive (MDE 0.1 pt)"
    assert vd.summarize([_c(INC, 0.5)], unit=1.0, unit_name="acc") == "inconclusive (MDE 0.5 acc)"
    assert vd.summarize([_c(INC, 0.5), _c(INC, 0.7)], unit=10.0, unit_name="dp") == \
        "inconclusive (2 of 2) (MDE 5.0-7.0 dp)"
    assert vd.summarize([_c(INC, 0.013)], unit_name="%") == "inconclusive (MDE 1.3 %)"


def test_a_claim_with_no_comparison_testable_says_why() -> None:
    """The claim's sentence carries the comparisons' own reason, not always "runs missing"."""
    assert vd.judge("c", [("a", None)], missing="no seed 3").verdict == "not testable (no seed 3)"
    assert vd.judge("c", [("a", None), ("b", None)]).verdict == "not testable (runs missing)"
    both = [vd.Comparison("a", vd.NOT_TESTABLE, reason="y"),
            vd.Comparison("b", vd.NOT_TESTABLE, reason="x"),
            vd.Comparison("c", vd.NOT_TESTABLE)]
    assert vd.summarize(both) == "not testable (x; y)"


def test_a_missing_p_value_never_reads_as_tiny() -> None:
    assert vd._p(float("nan")) == "-"
    line = vd.Comparison("a", vd.INCONCLUSIVE, 0.01, -0.01, 0.03, float("nan"),
                         float("nan")).text()
    assert line == "a: +1.00 pt [-1.00, +3.00], p - (Holm -): inconclusive"
