"""The check scripts' verdicts (scripts/): each exits 0 when what it checks holds and 1, after
one line saying what failed, when it does not. Their verdicts run here in-process on passing and
failing inputs; the slow parts (training jobs, a browser, sweeps) are replaced by their results."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _script(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """scripts/<name>.py as a module (its folder importable, as when it runs)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(f"script_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up there
    spec.loader.exec_module(module)
    return module


def _last_line(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


# -- check_learning ------------------------------------------------------------------------------

METRIC = "eval/main/avg/acc"
AGENTS = ("qwen3-1.7b-base", "qwen3-4b-base")


def _finals(accuracy: dict[str, float]) -> dict[str, dict[str, float]]:
    return {agent: {METRIC: acc} for agent, acc in accuracy.items()}


def test_check_learning_passes_when_every_agent_gains_enough(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    check = _script("check_learning", monkeypatch)
    # the jobs' final accuracies by method (seeds alike): gspo +10 and +2 points, hacpo +12, +8
    accuracy = {"base": {AGENTS[0]: 0.20, AGENTS[1]: 0.40},
                "gspo": {AGENTS[0]: 0.30, AGENTS[1]: 0.42},
                "hacpo": {AGENTS[0]: 0.32, AGENTS[1]: 0.48}}
    ran: list[str] = []

    def run(root: Path, overrides: list[str]) -> dict[str, dict[str, float]]:
        ran.append(root.name)
        return _finals(accuracy[root.name.split("-")[1]])

    monkeypatch.setattr(check, "run", run)
    argv = ["--methods", "gspo", "hacpo", "--seeds", "0", "1", "--out", str(tmp_path)]
    assert check.main([*argv, "--min-gain", "1"]) == 0
    assert _last_line(capsys).startswith("check_learning: ok")
    assert sorted(ran) == ["size-base-s0", "size-gspo-s0", "size-gspo-s1", "size-hacpo-s0",
                           "size-hacpo-s1"]
    # the default 5 points: the 4B agent's +2 with GSPO fails the check, and the line says so
    assert check.main(argv) == 1
    line = _last_line(capsys)
    assert line.startswith("check_learning: FAIL") and f"{AGENTS[1]} gspo +2.0" in line
    assert "hacpo" not in line


def test_check_learning_fails_on_a_failed_job_or_nothing_to_compare(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    check = _script("check_learning", monkeypatch)

    def failing(root: Path, overrides: list[str]) -> dict[str, dict[str, float]]:
        raise check.JobFailed(f"job {root.name} failed (exit 1)")

    monkeypatch.setattr(check, "run", failing)
    assert check.main(["--seeds", "0", "--out", str(tmp_path)]) == 1
    assert _last_line(capsys).startswith("check_learning: FAIL: job size-")
    # jobs that wrote no DONE.json: nothing compared is no pass
    monkeypatch.setattr(check, "run", lambda root, overrides: {})
    assert check.main(["--seeds", "0", "--out", str(tmp_path)]) == 1
    assert "the base job reported no agent" in _last_line(capsys)


def test_check_learning_verdict_names_missing_metrics_and_nan_gains(
        monkeypatch: pytest.MonkeyPatch) -> None:
    check = _script("check_learning", monkeypatch)
    results: dict[tuple[str, str, int], Any] = {
        ("size", "base", 0): _finals({AGENTS[0]: 0.2, AGENTS[1]: 0.4}),
        ("size", "gspo", 0): {AGENTS[0]: {METRIC: float("nan")}, AGENTS[1]: {}},
    }
    _, failures = check.verdict(results, ["size"], ["gspo"], [0], METRIC, 5.0)
    assert failures == [f"pair=size {AGENTS[0]} gspo +nan",
                        f"pair=size {AGENTS[1]} gspo: no {METRIC} in some seed"]


# -- check_report_html, check_mlflow_ui: the page's verdict --------------------------------------

def test_check_report_html_wants_every_image_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    check = _script("check_report_html", monkeypatch)
    assert check.image_problem('<html><body class="r" data-images="3/3"><img src="a.png">') is None
    assert check.image_problem('<body data-images="2/3">') == "1 of 3 images did not load"
    assert check.image_problem('<body data-images="0/0">') == "the page has no image"
    assert "load check did not run" in check.image_problem("<body>")


def test_check_mlflow_ui_wants_the_columns_and_named_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    check = _script("check_mlflow_ui", monkeypatch)
    columns = "".join(f'<div col-id="{c}x">' for c in check.COLUMNS)
    run = "<a>hacpo · size · seed 0</a>"
    assert check.page_problems(columns + run) == ([], ["hacpo · size · seed 0"])
    group = "<a>hacpo · size · 3 seeds</a>"  # a seed group, its jobs collapsed under it
    assert check.page_problems(columns + group) == ([], ["hacpo · size · 3 seeds"])
    problems, names = check.page_problems(columns + "<a>hacpo · size</a>")
    assert names == [] and problems == [
        "no run named '<method> · <pair> · seed <s>' (or '... · <n> seeds')"]
    problems, _ = check.page_problems(run)
    assert problems == [f"no column {c}" for c in check.COLUMNS]


def test_check_mlflow_ui_stops_reading_when_the_views_are_listed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`hacrl ui` lists its views, then the server logs on the same pipe without end: no view of
    the sweep in the list is a failure at the list's end, not a wait for more."""
    check = _script("check_mlflow_ui", monkeypatch)
    out = ("MLflow UI for sqlite:///x at http://127.0.0.1:5000 (Ctrl-C stops it)\n"
           "views (runs named by method, pair and seed; each agent's AVG as a column):\n"
           "  hacrl-tiny, all jobs: http://127.0.0.1:5000/#/a\n"
           "  hacrl-tiny, the jobs of sweep mini: http://127.0.0.1:5000/#/b\n"
           "[INFO] Starting gunicorn\n")
    assert check.find_view(io.StringIO(out), "mini", 5.0) == "http://127.0.0.1:5000/#/b"
    assert check.find_view(io.StringIO(out), "table1", 60.0) is None  # at once
    assert check.find_view(io.StringIO(""), "mini", 60.0) is None  # hacrl ui ended


# -- fault_campaign, stress_store: the campaign's verdict ----------------------------------------

def test_fault_campaign_fails_when_a_case_misbehaves_or_none_ran(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    campaign = _script("fault_campaign", monkeypatch)
    good = campaign.Outcome("report ../../x", True, 2, 1.0, "hacrl: bad name")
    bad = campaign.Outcome("damaged checkpoint", False, 1, 1.0, "Traceback", intact=False)
    assert campaign.verdict([good]) == 0
    assert _last_line(capsys) == "fault campaign: ok: all 1 cases behaved"
    assert campaign.verdict([good, bad]) == 1
    assert _last_line(capsys) == ("fault campaign: FAIL: 1 of 2 cases did not behave: "
                                  "damaged checkpoint")
    assert campaign.verdict([], "no_such_case") == 1
    assert _last_line(capsys).startswith("fault campaign: FAIL: no case ran (--only 'no_such_case'")


def test_stress_store_fails_when_a_point_is_lost(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    stress = _script("stress_store", monkeypatch)
    landed = {"n": 20}

    def repetition(root: Path, writers: int, points: int, *args: Any) -> Any:
        return stress.Repetition(writers, writers * points, landed=landed["n"])

    monkeypatch.setattr(stress, "repetition", repetition)
    argv = ["--writers", "2", "--points", "10", "--reps", "2", "--root", str(tmp_path)]
    assert stress.main(argv) == 0
    assert _last_line(capsys).startswith("stress_store: ok")
    landed["n"] = 19
    assert stress.main(argv) == 1
    assert _last_line(capsys).startswith(
        "stress_store: FAIL: rep 1: 1 of 20 points lost, 0 writer error(s); rep 2:")


# -- the benchmarks' own checks ------------------------------------------------------------------

def test_bench_sweep_cold_and_warm_scores_must_be_identical(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _script("bench_sweep", monkeypatch)
    cell = ("size", "hacpo", "0", "", "qwen3-4b-base")
    same = [{cell: {"eval/main/avg/acc": 0.25}}]
    assert bench._compare_scores(same, same, "cold", "warm", exact=True) == 0
    moved = [{cell: {"eval/main/avg/acc": 0.26}}]
    assert bench._compare_scores(same, moved, "cold", "warm", exact=True) == 1
    assert _last_line(capsys).startswith("bench_sweep: FAIL: the cold and warm sweeps")
    # a score only one way logged differs too; against another revision it is only reported
    extra = [{cell: {"eval/main/avg/acc": 0.25, "val/x/acc": 0.1}}]
    assert bench._compare_scores(same, extra, "cold", "warm", exact=True) == 1
    assert bench._compare_scores(same, moved, "old", "new", exact=False) == 0
    assert bench._compare_scores([{}], [{}], "cold", "warm", exact=True) == 1
    assert _last_line(capsys) == "bench_sweep: FAIL: no final scores to compare, cold vs warm"


def test_bench_zoo_weights_must_be_identical(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _script("bench_zoo", monkeypatch)

    def side(digest: str) -> dict[str, Any]:
        return {"cards": {"m": {"seconds": 2.0, "sft_steps": 4}}, "sha256": {"m": digest},
                "runs": [["m"]], "wall": 4.0, "cpu": 6.0}

    assert bench._report(side("aa"), side("aa"), workers=1) is True
    assert bench._report(side("aa"), side("bb"), workers=1) is False
    assert _last_line(capsys) == "bench_zoo: FAIL: the old and new weights differ for m"


# -- mutation: its table, kept in git for groups checked in full ---------------------------------

def test_mutation_table_is_kept_and_marked_stale_when_its_inputs_change(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    mutation = _script("mutation", monkeypatch)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("def f(x):\n    return x + 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_m.py").write_text("def test_f(): ...\n")
    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    monkeypatch.setattr(mutation, "WORK", tmp_path / ".mutation")
    monkeypatch.setattr(mutation, "RECORD_FILE", tmp_path / "record.json")
    monkeypatch.setattr(mutation, "EQUIVALENT_FILE", tmp_path / "none.toml")
    monkeypatch.setattr(mutation, "GROUPS", {"g": mutation.Group(("pkg/m.py",),
                                                                 ("tests/test_m.py",))})
    meta = tmp_path / ".mutation" / "g" / "mutants" / "pkg" / "m.py.meta"
    meta.parent.mkdir(parents=True)
    codes = {f"pkg.m.x_f__mutmut_{i}": 1 for i in range(1, 10)} | {"pkg.m.x_f__mutmut_10": 0}
    meta.write_text(json.dumps({"exit_code_by_key": codes | {"pkg.m.x_f__mutmut_11": None}}))
    # a sample (an unchecked mutant) is not kept
    assert mutation.report(["g"], 0.9, False, None, record=True) == 1
    assert "g: not recorded (not checked in full)" in capsys.readouterr().out
    assert json.loads((tmp_path / "record.json").read_text()) == {}
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    # checked in full, but the module changed after the run started: not kept either
    measured = tmp_path / ".mutation" / "g" / "measured.json"
    measured.write_text(json.dumps({"sources": mutation.sources_digest("g"), "commit": "abc1234"}))
    (tmp_path / "pkg" / "m.py").write_text("def f(x):\n    return x + 2\n")
    assert mutation.report(["g"], 0.9, False, None, record=True) == 0
    assert "g: not recorded: its modules or tests changed since" in capsys.readouterr().out
    assert json.loads((tmp_path / "record.json").read_text()) == {}
    (tmp_path / "pkg" / "m.py").write_text("def f(x):\n    return x + 1\n")
    assert mutation.report(["g"], 0.9, False, None, record=True) == 0
    kept = json.loads((tmp_path / "record.json").read_text())["g"]
    assert kept["commit"] == "abc1234"  # the commit the run started from
    assert kept["modules"]["pkg/m.py"] == {
        "counts": {"mutants": 10, "killed": 9, "survived": 1},
        "survivors": ["pkg.m.x_f__mutmut_10"]}
    # no results here (a new clone): the table comes from the record
    meta.unlink()
    assert mutation.report(["g"], 0.9, False, None) == 0
    out = capsys.readouterr().out
    assert "| g: pkg/m.py | 10 | 9 | 0 | 0 | 1 | 0 | 0 | 90.0% |" in out
    assert "g: recorded at" in out and "STALE" not in out
    # a test file changed since: the record no longer speaks for the group
    (tmp_path / "tests" / "test_m.py").write_text("def test_f(): assert True\n")
    assert mutation.report(["g"], 0.9, False, None) == 1
    out = capsys.readouterr().out
    assert "STALE" in out and "below the goal: g: its record is stale" in out
