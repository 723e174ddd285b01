"""hacrl.verify across processes: the Verifier on real and adversarial batches, hard deadlines,
worker replacement and the tripwire inside workers."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hacrl.verify import Grade, Verifier
from hacrl.verify.pool import GradingPool

TIMEOUT_S = 1.0  # per item in the adversarial batches
RUNAWAYS = range(5)  # the _adversarial items no machine can grade: each must be cut off


@pytest.fixture(scope="module")
def verifier() -> Iterator[Verifier]:
    with Verifier(timeout_s=5.0, workers=2) as v:
        yield v


def test_grade_fields_and_rewards(verifier: Verifier) -> None:
    grades = verifier.grade_many(
        ["so \\boxed{\\dfrac{3}{4}}", "\\boxed{0.5}", "no answer at all", "#### 1,000"],
        ["0.75", "\\frac{1}{2}", "3", "1000"])
    assert grades[0] == Grade(correct=True, exact_match=False, extracted="\\dfrac{3}{4}")
    assert grades[1] == Grade(correct=True, exact_match=True, extracted="0.5")
    assert grades[2] == Grade(correct=False, exact_match=False, extracted=None)
    assert grades[3].correct and grades[3].score == 1.0
    assert verifier.rewards(["\\boxed{2}", "\\boxed{3}"], ["2", "2"]) == [1.0, 0.0]
    assert verifier.rewards([], []) == []
    with pytest.raises(ValueError, match="^1 responses but 0 answers$"):
        verifier.grade_many(["a"], [])


def test_reference_may_be_boxed(verifier: Verifier) -> None:
    assert verifier.rewards(["\\boxed{\\frac{1}{2}}"], ["$\\boxed{0.5}$"]) == [1.0]


def _payloads(base: Path) -> list[str]:
    """Python that would create a file if anything evaluated it."""
    return [
        f"__import__('os').system('touch {base}/PWNED_system')",
        "open('pwned.txt','w').write('x')",
        f"open('{base}/pwned_abs.txt','w').write('x')",
        f"(lambda: exec(\"open('{base}/pwned_exec.txt','w').write('x')\"))()",
        f"__import__('pathlib').Path('{base}/pwned_path').touch()",
    ]


def test_payloads_are_real(tmp_path: Path) -> None:
    """Control: evaluated as Python, a payload does write its file (so the tests below mean it)."""
    eval(_payloads(tmp_path)[2])  # noqa: S307 - our own payload, into a temp dir
    assert (tmp_path / "pwned_abs.txt").exists()


def _adversarial(base: Path) -> list[tuple[str, str]]:
    megabyte = "blah " * 300_000
    items = [
        ("\\boxed{2^{10^{100}}}", "1"),
        ("\\boxed{9^{9^{9^{9}}}}", "1"),
        ("\\boxed{10^{10^{10}}!}", "1"),
        ("\\boxed{(10^{10})!}", "1"),
        ("\\boxed{\\sum_{i=1}^{10^{9}} i^{i}}", "1"),
        ("\\boxed{" + "{" * 100_000 + "1" + "}" * 100_000 + "}", "1"),
        ("\\boxed{" + "{" * 400 + "x" + "}" * 400 + "}", "x+1"),  # deep but under the length cap
        (megabyte, "1"),
        (megabyte + "\\boxed{7}", "7"),
        (megabyte + "\\boxed{\\frac{1}{" + "{2" * 10, "1"),  # truncated, unbalanced
        ("\\boxed{\\frac{1}{", "1"),
        ("\\boxed{\\left(1,2}", "(1,2)"),
        ("\\boxed{½}", "\\frac{1}{2}"),
        ("\\boxed{５}", "5"),
        ("\\boxed{\u05e9\u05dc\u05d5\u05dd \u202e123}", "123"),
        ("\\boxed{😀+1}", "2"),
        ("\\boxed{1\x002}", "12"),
        ("\\boxed{\ud800}", "1"),
        ("\\boxed{\\text{" + "a" * 5000 + "}}", "a"),
    ]
    items += [(f"\\boxed{{{p}}}", "0") for p in _payloads(base)]
    items += [(f"The answer is {p}", "x") for p in _payloads(base)]
    return items


def _expected_score(response: str, answer: str) -> float:
    return 1.0 if response.endswith("\\boxed{7}") and answer == "7" else 0.0


def test_adversarial_batch_is_bounded_and_harmless(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)  # the workers start here, so relative writes would land here
    items = _adversarial(tmp_path)
    with Verifier(timeout_s=TIMEOUT_S, workers=2) as v:
        grades = v.grade_many([r for r, _ in items], [a for _, a in items])
        assert [g.score for g in grades] == [_expected_score(r, a) for r, a in items]
        # Bounded: what outlives its deadline is cut off and reported so (the runaways always),
        # every item gets an answer, and no worker died under the batch
        assert all(grades[i].timed_out and grades[i].error == "timeout" for i in RUNAWAYS)
        assert all(g.error in (None, "timeout") for g in grades), [g.error for g in grades]
        assert v.pool.stats["timeouts"] == v.stats["timeouts"] == sum(
            o.timed_out for o in v.pool.last_outcomes) >= len(RUNAWAYS)
        assert v.pool.stats["deaths"] == 0
        # ...and the pool still grades normally afterwards
        assert v.rewards(["\\boxed{\\frac{2}{4}}"], ["0.5"]) == [1.0]
        assert v.pool.stats["unsafe"] == 0  # the LaTeX path never even tried to evaluate them
    assert sorted(os.listdir(work)) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd"]
    assert not Path("/tmp/PWNED").exists()


def test_each_adversarial_item_returns_in_time(tmp_path: Path) -> None:
    with Verifier(timeout_s=TIMEOUT_S, workers=2) as v:
        v.rewards(["\\boxed{x}"], ["y"])  # start the workers first
        items = _adversarial(tmp_path)
        # a runaway, megabytes with and without a box, unbalanced LaTeX, unicode, a payload
        for i in (0, 7, 8, 10, 12, 17, 19):
            response, answer = items[i]
            grade = v.grade_many([response], [answer])[0]
            assert grade.score == _expected_score(response, answer), response[:40]
            # an answer or the deadline, whichever came first; the runaway never answers
            assert grade.error in (None, "timeout") and grade.timed_out == (grade.error is not None)
            assert grade.timed_out or i not in RUNAWAYS, response[:40]
            assert len(v.pool._workers) == 2 and all(w.alive() for w in v.pool._workers)
    assert list(tmp_path.iterdir()) == []


def test_runaway_grade_is_cut_off_and_scores_zero() -> None:
    with Verifier(timeout_s=TIMEOUT_S, workers=1) as v:
        grade = v.grade_many(["\\boxed{2^{10^{100}}}"], ["1"])[0]
        assert grade.timed_out and not grade.correct and grade.score == 0.0
        assert v.stats["timeouts"] == 1 and v.pool.stats["timeouts"] == 1
        assert v.rewards(["\\boxed{\\frac{2}{4}}"], ["0.5"]) == [1.0]  # the pool goes on


def test_hard_deadline_kills_and_replaces_the_worker() -> None:
    with GradingPool(workers=1, timeout_s=2.0) as pool:
        pool.run([("_sleep", (0,))])  # warm
        first = pool._workers[0].proc
        out = pool.run([("_sleep", (60,)), ("grade", ("\\frac13", "1/3"))])
        assert out[0].timed_out and not out[0].value and out[0].error == "timeout"
        assert first.returncode == -9  # SIGKILLed (`_sleep` ignores the soft deadline)
        assert pool._workers[0].proc is not first and pool._workers[0].alive()
        assert out[1].value and not out[1].timed_out
        assert pool.stats["restarts"] == 1 and pool.stats["timeouts"] == 1
        assert pool.run([("grade", ("2", "\\sqrt{4}"))])[0].value  # keeps working


def test_runaways_do_not_stall_the_batch() -> None:
    # 2 s: the grades must finish in time even on a loaded machine
    with GradingPool(workers=2, timeout_s=2.0) as pool:
        pool.run([("_sleep", (0,))] * 2)
        out = pool.run([("_sleep", (60,))] * 4 + [("grade", ("x+1", "1+x"))] * 4)
        assert [o.timed_out for o in out] == [True] * 4 + [False] * 4
        assert all(o.value for o in out[4:])
        # each runaway was killed at its deadline and its worker replaced, rather than waited
        # for (60 s each)
        assert pool.stats["timeouts"] == 4 and pool.stats["restarts"] == 4
        assert pool.stats["deaths"] == 0


def test_worker_death_scores_zero_and_is_replaced() -> None:
    with GradingPool(workers=1, timeout_s=10.0) as pool:
        pool.run([("_sleep", (0,))])
        victim = pool._workers[0].proc.pid
        killer = threading.Timer(0.3, os.kill, (victim, 9))
        killer.start()
        out = pool.run([("_sleep", (5,)), ("grade", ("1", "1.0"))])
        killer.join()
        assert out[0].error == "grading worker died" and not out[0].value
        assert out[1].value
        # a worker killed while idle is replaced before it is given anything
        os.kill(pool._workers[0].proc.pid, 9)
        pool._workers[0].proc.wait()
        assert pool.run([("grade", ("\\frac{1}{2}", "0.5"))])[0].value
        assert pool.stats["deaths"] == 1


def test_tripwire_fires_inside_workers(verifier: Verifier) -> None:
    pool = verifier.pool
    before = pool.stats["unsafe"]
    out = pool.run([
        ("_probe_tripwire", ("__import__('os').getcwd()",)),
        ("_probe_tripwire", ("x + 1",)),
        ("_probe_tripwire", ("12",)),  # numerals are built without evaluation
    ])
    assert [o.value for o in out] == [False, False, True]
    assert out[0].error is not None and out[0].error.startswith("unsafe evaluation")
    assert pool.stats["unsafe"] == before + 2


def test_workers_are_reused_and_restart_after_close() -> None:
    v = Verifier(timeout_s=5.0, workers=2)
    assert v.pool._workers == []  # lazy
    assert v.rewards(["\\boxed{x+1}"], ["1+x"]) == [1.0]
    pids = {w.proc.pid for w in v.pool._workers}
    assert len(pids) == 2
    assert v.rewards(["\\boxed{x+2}"], ["2+x"]) == [1.0]
    assert {w.proc.pid for w in v.pool._workers} == pids
    v.close()
    assert v.pool._workers == []
    assert v.rewards(["\\boxed{x+3}"], ["3+x"]) == [1.0]
    v.close()


def test_waiting_parent_does_not_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    """While one worker is busy and the other idle, the parent sleeps in `wait`, not a busy loop
    (regression: an idle worker's long-past start-up deadline once made the wait time 0)."""
    from hacrl.verify import pool as pool_module

    with GradingPool(workers=2, timeout_s=5.0) as pool:
        while not (pool._workers and all(w.ready for w in pool._workers)):
            pool.run([("_sleep", (0.2,))] * 2)  # until both have said ready (a slow start)
        monkeypatch.setattr(pool_module, "START_TIMEOUT_S", 0.0)  # both are "old" now
        pauses: list[float | None] = []  # the parent's waits, each a wake-up
        wait = pool_module.wait

        def counted(conns, timeout=None):
            pauses.append(timeout)
            return wait(conns, timeout)

        monkeypatch.setattr(pool_module, "wait", counted)
        assert pool.run([("_sleep", (0.5,))])[0].value
        # it slept until the result came (a spinning parent polls with no pause, thousands of
        # times in half a second)
        assert 1 <= len(pauses) <= 2 and all(p is not None and p > 0 for p in pauses), pauses[:5]


# -- how a batch is decided: the Verifier's counters, de-duplication and bounds ---------------


def test_each_item_is_decided_once_and_counted_by_how(monkeypatch: pytest.MonkeyPatch) -> None:
    """no_answer / no_reference / fast_path / long / math_verify, counted per item; identical
    (answer, reference) pairs go to the workers once; `max_answer_chars` is the longest answer
    still graded by math-verify; the counters add up over batches."""
    with Verifier(timeout_s=10.0, workers=1, max_answer_chars=7) as v:
        sent: list[list[object]] = []
        run = v.pool.run

        def spy(tasks, timeout_s=None):  # the real pool, its input recorded
            sent.append(list(tasks))
            return run(tasks, timeout_s)

        monkeypatch.setattr(v.pool, "run", spy)
        grades = v.grade_many(
            ["nothing", "\\boxed{}", "\\boxed{5}",  # no answer x2, no reference x2
             "\\boxed{7}", "\\boxed{+07}", "\\boxed{0.50}",  # fast path x3
             "\\boxed{x+1+0+0+0}", "\\boxed{x+1}",  # long (9 characters) x2
             "\\boxed{x+1+0+0}", "\\boxed{x+1}",  # 7 characters: math-verify
             "\\boxed{x+1}", "\\boxed{x+1}", "\\boxed{x+2}",  # math-verify, a pair twice
             "\\boxed{6}"],
            ["1", "", "\\boxed{$ $}", "7", "7", "0.5", "1+x", "1+x+0+0+0", "1+x", "1+x+0+0", "1+x", "1+x",
             "1+x", "  "])
        assert sent == [[("grade", ("x+1+0+0", "1+x")), ("grade", ("x+1", "1+x+0+0")),
                         ("grade", ("x+1", "1+x")), ("grade", ("x+2", "1+x"))]]
        assert grades == [
            Grade(False, False, None), Grade(False, False, None),
            Grade(False, False, "5", error="no reference answer"),
            Grade(True, True, "7"), Grade(True, False, "+07"), Grade(True, False, "0.50"),
            Grade(False, False, "x+1+0+0+0"), Grade(False, False, "x+1"),
            Grade(True, False, "x+1+0+0"), Grade(True, False, "x+1"),
            Grade(True, False, "x+1"), Grade(True, False, "x+1"), Grade(False, False, "x+2"),
            Grade(False, False, "6", error="no reference answer")]
        assert v.stats == {"no_answer": 2, "no_reference": 2, "fast_path": 3, "long": 2,
                           "math_verify": 5}
        assert v.grade_many(["\\boxed{5}", "\\boxed{6}"], ["5", "5"]) == [
            Grade(True, True, "5"), Grade(False, False, "6")]
        assert v.stats["fast_path"] == 5 and v.stats["no_answer"] == 2
        assert len(sent) == 1  # a batch settled in this process starts no grading at all


def test_refused_and_failed_grades_are_counted_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's refusal (the tripwire) counts as unsafe, any other failure as an error, a
    cut-off as a timeout; each scores 0 with its reason. The workers really run these: the
    grading tasks are swapped for a tripwire probe, an unknown task and a sleep past the
    deadline."""
    with Verifier(timeout_s=1.0, workers=1) as v:
        run = v.pool.run
        swap = {"1": ("_probe_tripwire", ("__import__('os').getcwd()",)),
                "2": ("_no_such_task", ()), "3": ("_sleep", (30,)), "4": ("_sleep", (0,)),
                "5": ("_probe_tripwire", ("open('x')",)), "6": ("_other_task", ())}
        monkeypatch.setattr(v.pool, "run", lambda tasks, timeout_s=None: run(
            [swap[gold] for _, (_, gold) in tasks], timeout_s))
        grades = v.grade_many(["\\boxed{x}"] * 7, ["1", "2", "3", "4", "1", "5", "6"])
    assert [(g.correct, g.timed_out) for g in grades] == [
        (False, False), (False, False), (False, True), (True, False), (False, False),
        (False, False), (False, False)]
    assert grades[0].error is not None and grades[0].error.startswith("unsafe evaluation")
    assert grades[0] == grades[4]  # the same pair: graded once, both answers get its outcome
    assert grades[1].error == "unknown task kind '_no_such_task'"
    assert grades[2].error == "timeout" and grades[3].error is None
    assert v.stats == {"math_verify": 7, "unsafe": 2, "errors": 2, "timeouts": 1}


def test_settings_reach_the_pool_and_shared_verifiers_are_kept_per_setting() -> None:
    """`Verifier`'s bounds are its pool's; the documented defaults (3 s, 2 workers, answers up
    to 1000 characters for math-verify); `default_verifier` keeps one per setting."""
    from hacrl.verify import _defaults, default_verifier

    v = Verifier(timeout_s=0.5, workers=1, max_answer_chars=9)
    assert (v.timeout_s, v.pool.timeout_s, v.pool.n_workers, v.max_answer_chars) == (0.5, 0.5, 1, 9)
    d = Verifier()
    assert (d.timeout_s, d.pool.n_workers, d.max_answer_chars) == (3.0, 2, 1000)
    shared = default_verifier()
    assert (shared.timeout_s, shared.pool.n_workers, shared.max_answer_chars) == (3.0, 2, 1000)
    assert default_verifier(3, 2, 1000) is shared
    other = default_verifier(2.0, 1, 50)
    assert other is not shared and _defaults[(2.0, 1, 50)] is other
    assert (other.timeout_s, other.pool.n_workers, other.max_answer_chars) == (2.0, 1, 50)


def test_references_lose_their_box_and_dollars(verifier: Verifier) -> None:
    """A reference kept boxed or in `$` grades like the bare one (exact match included); a
    missing reference matches nothing, not even an empty or placeholder-like answer."""
    golds = ["\\boxed{0.5}", "$\\boxed{7}$", "\\fbox{7}", "\\boxed{$7$}", " $7$ ", "\\boxed{x+1",
             "$X$"]
    preds = ["0.5", "7", "7", "7", "7", "\\boxed{x+1", "X"]
    grades = verifier.grade_many([f"The answer is {p}" for p in preds], golds)
    assert [(g.correct, g.exact_match) for g in grades] == [(True, True)] * 7
    none = verifier.grade_many(["\\boxed{XXXX}", "\\boxed{}", "\\boxed{None}"],
                               [None] * 3)  # type: ignore[list-item]
    assert [(g.correct, g.exact_match, g.error) for g in none] == [
        (False, False, "no reference answer"), (False, False, None),
        (False, False, "no reference answer")]
