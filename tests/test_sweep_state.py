"""A sweep's state (`hacrl.sweep.state`): cell state files, whether a running cell is alive,
what the artifacts say about a cell (run directory and MLflow store), a cell's status row and
the status table, each pinned to its exact values."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hacrl.core.layout import RunDir
from hacrl.job.finishing import mark_done
from hacrl.schema import tags as T
from hacrl.schema.sweep_manifest import CellRecord, SweepManifest, write_manifest
from hacrl.sweep import state
from hacrl.sweep.grid import Cell
from hacrl.sweep.state import (
    DEADLINE_S,
    _evaluated,
    alive,
    artifacts_status,
    cell_state_path,
    cell_status,
    format_table,
    phase_text,
    progress_text,
    read_cells,
    read_json,
)
from hacrl.tracking import Tracker, process_token

NOW = 1_700_000_000.0
HERE = "this-node"
ELSEWHERE = "node-elsewhere"


# -- helpers: real stores, run directories and cells ---------------------------------------------


@pytest.fixture
def tracker(new_output_root: Callable[[str], Path]) -> Tracker:
    """A fresh MLflow sqlite store (a copy of the migrated template) of this test."""
    return Tracker(f"sqlite:///{new_output_root('out') / 'mlflow.db'}", "hacrl-tiny")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wall clock stands at NOW (for heartbeats and durations)."""
    monkeypatch.setattr(time, "time", lambda: NOW)


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch) -> str:
    """This machine is called HERE."""
    monkeypatch.setattr(socket, "gethostname", lambda: HERE)
    return HERE


def _base_cell(**changes: Any) -> Cell:
    """An evaluation-only cell (method=base) of two models, two protocols, two benchmarks."""
    fields: dict[str, Any] = dict(
        id="base0cell", overrides=[], method="base", agents=["a", "b"], seed=0,
        sweeps=["table1"], protocols=["main", "wide"], trains=False,
        model_paths={"a": "/zoo/model-a", "b": "/zoo/model-b"},
        protocol_keys={"main": "k-main", "wide": "k-wide"}, benchmarks=["b1", "b2"],
        scale="tiny", zoo_seed=0)
    fields.update(changes)
    return Cell(**fields)


def _train_cell(run_dir: Path, **changes: Any) -> Cell:
    """A training cell of two agents ("hacpo a+b s1 alpha=2"), one protocol, two benchmarks."""
    fields: dict[str, Any] = dict(
        id="c0ffee12", overrides=["algo.alpha=2"], method="hacpo", agents=["a", "b"], seed=1,
        sweeps=["table1", "table9"], protocols=["main"], trains=True, run_dir=str(run_dir),
        protocol_keys={"main": "k-main"}, benchmarks=["b1", "b2"], scale="tiny")
    fields.update(changes)
    return Cell(**fields)


def _eval_tags(keys: dict[str, str], benchmarks: list[str]) -> dict[str, str]:
    tags = {}
    for protocol, key in keys.items():
        tags[T.eval_tag(protocol, "key")] = key
        tags[T.eval_tag(protocol, "benchmarks")] = json.dumps(benchmarks)
    return tags


GOOD = {"main": "k-main", "wide": "k-wide"}


def _eval_run(tracker: Tracker, model_path: str, keys: dict[str, str] | None = None,
              benchmarks: list[str] | None = None, scale: str = "tiny",
              draw: str | None = None) -> str:
    """A finished evaluation run of the model at `model_path` (a base model's own)."""
    tags = {T.KIND: T.EVAL, T.MODEL_PATH: model_path, T.SCALE: scale,
            **_eval_tags(GOOD if keys is None else keys,
                         ["b1", "b2"] if benchmarks is None else benchmarks)}
    if draw is not None:
        tags[T.ZOO_SEED] = draw
    run = tracker.start_run(f"base · {model_path}", tags)
    tracker.finish(run)
    return run


def _job(tracker: Tracker, config_hash: str, status: str | None = "FINISHED") -> str:
    run = tracker.start_run("job", {T.CONFIG_HASH: config_hash, T.KIND: T.JOB})
    if status is not None:
        tracker.finish(run, status)
    return run


def _child(tracker: Tracker, job: str, config_hash: str, model: str,
           keys: dict[str, str] | None = None, benchmarks: list[str] | None = None) -> str:
    """The agent run of `model` in `job`, evaluated under `keys` on `benchmarks`."""
    tags = {T.CONFIG_HASH: config_hash, T.KIND: T.AGENT, T.MODEL: model,
            **_eval_tags({"main": "k-main"} if keys is None else keys,
                         ["b1", "b2"] if benchmarks is None else benchmarks)}
    run = tracker.start_run("agent", tags, parent_run_id=job)
    tracker.finish(run)
    return run


def _teams_done(run_dir: Path, *done: bool) -> None:
    """team-<i>/ folders of a job, with DONE.json (by the job's own writer) where True, none where
    False."""
    for index, finished in enumerate(done):
        team = RunDir(run_dir).team(index)
        team.path.mkdir(parents=True, exist_ok=True)
        if finished:
            mark_done(team, {"steps": 2, "agents": ["a"], "final": {}})
        else:
            team.done.unlink(missing_ok=True)


def _write_state(sweep_dir: Path, cell_id: str, record: Any) -> None:
    path = cell_state_path(sweep_dir, cell_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def _dead_pid() -> int:
    """The pid of a process that has ended (and been waited for)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# -- state files -------------------------------------------------------------------------------


def test_cell_state_path_is_cells_folder_json(tmp_path: Path) -> None:
    assert cell_state_path(tmp_path, "abc123") == tmp_path / "cells" / "abc123.json"


def test_read_json_returns_the_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"status": "running", "pid": 7, "nested": {"a": [1, 2]}}')
    assert read_json(path) == {"status": "running", "pid": 7, "nested": {"a": [1, 2]}}
    assert capsys.readouterr() == ("", "")


def test_read_json_of_a_missing_file_is_empty_and_silent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert read_json(tmp_path / "nothing.json") == {}
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("content", ["{truncated", "", "[1, 2]", '"running"', "3", "null"])
def test_read_json_of_a_damaged_or_foreign_file_is_empty_with_one_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str) -> None:
    path = tmp_path / "cell.json"
    path.write_text(content)
    assert read_json(path) == {}
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"hacrl: warning: {path} is not a hacrl state file (damaged?); ignored\n"


def test_read_json_of_an_unreadable_path_is_empty_with_one_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder where the file should be: an OSError other than a missing file."""
    path = tmp_path / "cell.json"
    path.mkdir()
    assert read_json(path) == {}
    assert capsys.readouterr() == (
        "", f"hacrl: warning: {path} is not a hacrl state file (damaged?); ignored\n")


def test_read_cells_without_a_manifest_is_none_and_no_cells(tmp_path: Path) -> None:
    assert read_cells(tmp_path) == (None, [])


def test_read_cells_returns_the_manifest_and_its_cells_as_cells(tmp_path: Path) -> None:
    records = [CellRecord(id="c1", overrides=["seed=1"], method="gspo", agents=["a"], seed=1),
               CellRecord(id="c2", overrides=[], method="hacpo", agents=["a", "b"], seed=0,
                          sweeps=["table1"], protocols=["main"])]
    write_manifest(tmp_path, SweepManifest(sweep="t", cells=records, created=5.0))
    manifest, cells = read_cells(tmp_path)
    assert manifest is not None and manifest.sweep == "t" and manifest.cells == records
    assert [type(c) for c in cells] == [Cell, Cell]
    assert cells == [Cell.of(r) for r in records]
    assert [c.label for c in cells] == ["gspo a s1", "hacpo a+b s0"]


# -- alive: on this host by pid and token, elsewhere by heartbeat -------------------------------


def test_alive_on_this_host_when_the_pid_and_token_are_this_process(here: str) -> None:
    pid = os.getpid()
    token = process_token(pid)
    assert token
    assert alive({"host": here, "pid": pid, "pid_token": token}) is True
    assert alive({"host": here, "pid": str(pid), "pid_token": token}) is True  # pid as text


def test_alive_on_this_host_without_a_token_trusts_the_pid(here: str) -> None:
    assert alive({"host": here, "pid": os.getpid()}) is True
    assert alive({"host": here, "pid": os.getpid(), "pid_token": None}) is True
    # a token that is not text counts as none (not as a token that differs)
    assert alive({"host": here, "pid": os.getpid(), "pid_token": 12345}) is True


def test_not_alive_on_this_host_when_the_pid_now_belongs_to_another_process(here: str) -> None:
    assert alive({"host": here, "pid": os.getpid(), "pid_token": "someone-else:1"}) is False


def test_not_alive_on_this_host_when_the_process_ended(here: str, clock: None) -> None:
    pid = _dead_pid()
    assert alive({"host": here, "pid": pid}) is False
    assert alive({"host": here, "pid": pid, "heartbeat": NOW}) is False  # a fresh beat unused


@pytest.mark.parametrize("pid", [None, 0, "", "abc", [1], {"p": 1}, -1])
def test_not_alive_on_this_host_without_a_usable_pid(here: str, pid: object, clock: None) -> None:
    """No pid, pid 0 (never 1, init, which always runs), or one that is not a number."""
    assert alive({"host": here, "pid": pid, "heartbeat": NOW}) is False


def test_not_alive_on_this_host_without_a_pid_key(here: str, clock: None) -> None:
    assert alive({"host": here, "started": NOW}) is False


def test_this_hosts_pid_check_applies_only_to_this_host(here: str, clock: None) -> None:
    """The same live pid on another host (or no host) is judged by its heartbeat alone."""
    assert alive({"host": ELSEWHERE, "pid": os.getpid(), "heartbeat": NOW - 4000}) is False
    assert alive({"pid": os.getpid(), "heartbeat": NOW - 4000}) is False
    assert alive({"host": ELSEWHERE, "pid": _dead_pid(), "heartbeat": NOW - 1}) is True


@pytest.mark.parametrize(("age", "expected"), [
    (0.0, True), (1.0, True), (DEADLINE_S - 1, True), (DEADLINE_S - 0.001, True),
    (DEADLINE_S, False), (DEADLINE_S + 0.001, False), (DEADLINE_S + 1, False), (3600.0, False),
])
def test_heartbeat_elsewhere_expires_at_the_deadline(here: str, clock: None, age: float,
                                                     expected: bool) -> None:
    assert DEADLINE_S == 300.0
    assert alive({"host": ELSEWHERE, "pid": 1, "heartbeat": NOW - age}) is expected


def test_a_heartbeat_from_the_future_counts_as_alive(here: str, clock: None) -> None:
    """A node whose clock runs ahead: the beat is newer than now, not expired."""
    assert alive({"host": ELSEWHERE, "heartbeat": NOW + 1000}) is True


def test_an_integer_heartbeat_counts(here: str, clock: None) -> None:
    assert alive({"host": ELSEWHERE, "heartbeat": int(NOW) - 10}) is True
    assert alive({"host": ELSEWHERE, "heartbeat": int(NOW) - 301}) is False


def test_without_a_heartbeat_the_start_time_is_used(here: str, clock: None) -> None:
    assert alive({"host": ELSEWHERE, "started": NOW - 10}) is True
    assert alive({"host": ELSEWHERE, "started": NOW - DEADLINE_S}) is False
    assert alive({"host": ELSEWHERE, "started": NOW - DEADLINE_S + 1}) is True


def test_the_heartbeat_wins_over_the_start_time(here: str, clock: None) -> None:
    assert alive({"host": ELSEWHERE, "heartbeat": NOW - 10, "started": NOW - 4000}) is True
    assert alive({"host": ELSEWHERE, "heartbeat": NOW - 4000, "started": NOW - 10}) is False


@pytest.mark.parametrize("beat", ["1700000000", None, [NOW], {"t": NOW}])
def test_a_heartbeat_that_is_not_a_number_is_dead(here: str, clock: None, beat: object) -> None:
    assert alive({"host": ELSEWHERE, "heartbeat": beat, "started": NOW - 1}) is False


def test_neither_heartbeat_nor_start_is_dead(here: str, clock: None) -> None:
    assert alive({"host": ELSEWHERE}) is False
    assert alive({}) is False


# -- _evaluated: every protocol with its key, on every benchmark --------------------------------


def _tagged_run(tracker: Tracker, tags: dict[str, str]) -> str:
    run = tracker.start_run("eval", {T.KIND: T.EVAL, **tags})
    tracker.finish(run)
    return run


def test_evaluated_with_every_key_and_exactly_the_benchmarks(tracker: Tracker) -> None:
    run = _tagged_run(tracker, _eval_tags(GOOD, ["b2", "b1"]))
    assert _evaluated(tracker, run, _base_cell()) is True


def test_evaluated_on_more_benchmarks_than_the_cell_reads(tracker: Tracker) -> None:
    run = _tagged_run(tracker, _eval_tags(GOOD, ["b0", "b1", "b2", "b3"]))
    assert _evaluated(tracker, run, _base_cell()) is True


def test_not_evaluated_when_a_benchmark_is_missing(tracker: Tracker) -> None:
    """e.g. only MATH-500 logged, for a sweep that reads them all."""
    run = _tagged_run(tracker, _eval_tags(GOOD, ["b1"]))
    assert _evaluated(tracker, run, _base_cell()) is False


def test_not_evaluated_when_the_last_protocol_misses_a_benchmark(tracker: Tracker) -> None:
    tags = {**_eval_tags({"main": "k-main"}, ["b1", "b2"]),
            **_eval_tags({"wide": "k-wide"}, ["b2"])}
    assert _evaluated(tracker, _tagged_run(tracker, tags), _base_cell()) is False


@pytest.mark.parametrize("keys", [
    {"main": "k-main", "wide": "k-other"},   # the last protocol under other settings
    {"main": "k-other", "wide": "k-wide"},   # the first
    {"main": "k-main"},                      # a protocol never evaluated
    {"wide": "k-wide"},
    {"main": "k-wide", "wide": "k-main"},    # keys swapped
])
def test_not_evaluated_with_a_wrong_or_missing_key(tracker: Tracker, keys: dict[str, str]) -> None:
    run = _tagged_run(tracker, _eval_tags(keys, ["b1", "b2"]))
    assert _evaluated(tracker, run, _base_cell()) is False


def test_not_evaluated_when_the_benchmarks_tag_is_missing(tracker: Tracker) -> None:
    run = _tagged_run(tracker, {T.eval_tag("main", "key"): "k-main",
                                T.eval_tag("wide", "key"): "k-wide"})
    assert _evaluated(tracker, run, _base_cell()) is False


def test_a_cell_that_reads_every_benchmark_needs_no_benchmarks_tag(tracker: Tracker) -> None:
    """benchmarks=[] (manifests from before it): the keys alone decide."""
    run = _tagged_run(tracker, {T.eval_tag("main", "key"): "k-main",
                                T.eval_tag("wide", "key"): "k-wide"})
    assert _evaluated(tracker, run, _base_cell(benchmarks=[])) is True
    other = _tagged_run(tracker, {T.eval_tag("main", "key"): "k-main"})
    assert _evaluated(tracker, other, _base_cell(benchmarks=[])) is False


@pytest.mark.parametrize("logged", ["not json", '"b1b2"', '{"b1": 1, "b2": 2}'])
def test_a_damaged_benchmarks_tag_means_not_evaluated(tracker: Tracker, logged: str) -> None:
    """Not a crash of the sweep's check, and not a set of characters or keys that happens to
    cover the cell's benchmarks."""
    keys = {T.eval_tag("main", "key"): "k-main", T.eval_tag("wide", "key"): "k-wide"}
    run = _tagged_run(tracker, {**keys, T.eval_tag("main", "benchmarks"): logged,
                                T.eval_tag("wide", "benchmarks"): logged})
    assert _evaluated(tracker, run, _base_cell(benchmarks=["b", "1"])) is False
    assert _evaluated(tracker, run, _base_cell(benchmarks=["b1"])) is False


# -- artifacts_status: a base cell (evaluation only) --------------------------------------------


def test_base_cell_without_models_is_absent_not_done(tracker: Tracker) -> None:
    """A manifest cell that names no model (damaged, or from an older hacrl) is not done."""
    assert artifacts_status(_base_cell(model_paths={}), tracker) == ("absent", "")


def test_base_cell_without_evaluations_is_absent(tracker: Tracker) -> None:
    assert artifacts_status(_base_cell(), tracker) == ("absent", "")


def test_base_cell_with_every_model_evaluated_is_done_with_their_runs(tracker: Tracker) -> None:
    run_b = _eval_run(tracker, "/zoo/model-b")
    run_a = _eval_run(tracker, "/zoo/model-a")
    assert artifacts_status(_base_cell(), tracker) == ("done", f"{run_a},{run_b}")


def test_base_cell_of_one_model_is_done_with_its_run(tracker: Tracker) -> None:
    run_a = _eval_run(tracker, "/zoo/model-a")
    cell = _base_cell(agents=["a"], model_paths={"a": "/zoo/model-a"})
    assert artifacts_status(cell, tracker) == ("done", run_a)


def test_base_cell_with_one_model_not_evaluated_is_absent(tracker: Tracker) -> None:
    _eval_run(tracker, "/zoo/model-a")
    assert artifacts_status(_base_cell(), tracker) == ("absent", "")
    _eval_run(tracker, "/zoo/model-b", keys={"main": "k-main", "wide": "old-key"})
    assert artifacts_status(_base_cell(), tracker) == ("absent", "")


def test_base_cell_with_the_first_model_not_evaluated_is_absent(tracker: Tracker) -> None:
    _eval_run(tracker, "/zoo/model-a", benchmarks=["b1"])
    _eval_run(tracker, "/zoo/model-b")
    assert artifacts_status(_base_cell(), tracker) == ("absent", "")


def test_base_cell_is_judged_by_each_models_newest_evaluation_run(
        tracker: Tracker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run an evaluation writes into (`standalone_run`: the newest) is the one that counts:
    an older run under the cell's settings does not make a newer one under others done."""
    monkeypatch.setattr(time, "time", lambda: NOW)  # the runs' start times, one minute apart
    _eval_run(tracker, "/zoo/model-a")
    run_b = _eval_run(tracker, "/zoo/model-b")
    monkeypatch.setattr(time, "time", lambda: NOW + 60)
    _eval_run(tracker, "/zoo/model-a", keys={"main": "k-old", "wide": "k-wide"})
    assert artifacts_status(_base_cell(), tracker) == ("absent", "")
    monkeypatch.setattr(time, "time", lambda: NOW + 120)
    run_a = _eval_run(tracker, "/zoo/model-a")
    assert artifacts_status(_base_cell(), tracker) == ("done", f"{run_a},{run_b}")


def test_base_cell_counts_only_evaluations_of_its_scale_and_draw(tracker: Tracker) -> None:
    for path in ("/zoo/model-a", "/zoo/model-b"):
        _eval_run(tracker, path, scale="paper")
        _eval_run(tracker, path, draw="1")
    assert artifacts_status(_base_cell(), tracker) == ("absent", "")
    run_a = _eval_run(tracker, "/zoo/model-a", draw="2")
    run_b = _eval_run(tracker, "/zoo/model-b", draw="2")
    assert artifacts_status(_base_cell(zoo_seed=2), tracker) == ("done", f"{run_a},{run_b}")
    assert artifacts_status(_base_cell(zoo_seed=3), tracker) == ("absent", "")


# -- artifacts_status: a training cell -----------------------------------------------------------


def test_training_cell_without_a_run_directory_is_absent(tracker: Tracker, tmp_path: Path) -> None:
    cell = _train_cell(tmp_path / "runs" / "c0ffee12-hacpo")
    _job(tracker, cell.id)  # even a finished job run does not make it trained without DONE
    assert artifacts_status(cell, tracker) == ("absent", "")


def test_training_cell_with_a_team_not_done_is_absent(tracker: Tracker, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "c0ffee12-hacpo"
    cell = _train_cell(run_dir)
    job = _job(tracker, cell.id)
    _child(tracker, job, cell.id, "a")
    _child(tracker, job, cell.id, "b")
    _teams_done(run_dir, False, False)
    assert artifacts_status(cell, tracker) == ("absent", "")
    _teams_done(run_dir, True, False)
    assert artifacts_status(cell, tracker) == ("absent", "")
    _teams_done(run_dir, False, True)
    assert artifacts_status(cell, tracker) == ("absent", "")


def test_training_cell_with_a_damaged_done_is_absent(
        tracker: Tracker, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "runs" / "c0ffee12-hacpo"
    cell = _train_cell(run_dir)
    _teams_done(run_dir, True)
    RunDir(run_dir).team(0).done.write_text('{"agents": ["a"]}')  # no "final"
    assert artifacts_status(cell, tracker) == ("absent", "")
    assert "damaged" in capsys.readouterr().err


def test_training_cell_done_on_disk_without_a_finished_job_run_is_trained(
        tracker: Tracker, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "c0ffee12-hacpo"
    cell = _train_cell(run_dir)
    _teams_done(run_dir, True, True)
    assert artifacts_status(cell, tracker) == ("trained", "")
    _job(tracker, cell.id, status=None)        # still RUNNING (killed while finishing)
    _job(tracker, cell.id, status="KILLED")
    _job(tracker, "another-cell")              # another cell's finished job
    assert artifacts_status(cell, tracker) == ("trained", "")


def test_an_agent_run_of_the_cell_is_not_its_job_run(tracker: Tracker, tmp_path: Path) -> None:
    """Agent runs carry the config hash too; only the job run (kind job) says finished."""
    run_dir = tmp_path / "runs" / "c0ffee12-hacpo"
    cell = _train_cell(run_dir, cost=True)
    _teams_done(run_dir, True)
    _child(tracker, "no-such-job", cell.id, "a")
    assert artifacts_status(cell, tracker) == ("trained", "")


def test_training_cell_with_every_agent_evaluated_is_done(tracker: Tracker, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "c0ffee12-hacpo"
    cell = _train_cell(run_dir)
    _teams_done(run_dir, True, True)
    job = _job(tracker, cell.id)
    _child(tracker, job, cell.id, "a")
    assert artifacts_status(cell, tracker) == ("trained", job)  # 1 agent run for 2 agents
    _child(tracker, job, cell.id, "a")
    assert artifacts_status(cell, tracker) == ("trained", job)  # 2 runs, but of one agent
    _child(tracker, job, cell.id, "b", benchmarks=["b1", "b2", "b3"])
    assert artifacts_status(cell, tracker) == ("done", job)
    # a leftover run of an attempt that died before evaluating does not block it
    _child(tracker, job, cell.id, "b", keys={}, benchmarks=[])
    assert artifacts_status(cell, tracker) == ("done", job)


@pytest.mark.parametrize(("lacking", "evaluation"), [
    ("b", {"benchmarks": ["b1"]}),          # an agent run missing a benchmark
    ("a", {"keys": {"main": "k-old"}}),     # one evaluated under another protocol key
])
def test_training_cell_with_an_agent_run_not_fully_evaluated_is_trained(
        tracker: Tracker, tmp_path: Path, lacking: str, evaluation: dict[str, Any]) -> None:
    run_dir = tmp_path / "runs" / "c0ffee12-hacpo"
    cell = _train_cell(run_dir)
    _teams_done(run_dir, True, True)
    job = _job(tracker, cell.id)
    for agent in ("a", "b"):
        _child(tracker, job, cell.id, agent, **(evaluation if agent == lacking else {}))
    assert artifacts_status(cell, tracker) == ("trained", job)


def test_agent_runs_of_another_job_do_not_count(tracker: Tracker, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "c0ffee12-hacpo"
    cell = _train_cell(run_dir)
    _teams_done(run_dir, True, True)
    other = _job(tracker, "another-cell")
    _child(tracker, other, cell.id, "a")
    _child(tracker, other, cell.id, "b")
    job = _job(tracker, cell.id)
    assert artifacts_status(cell, tracker) == ("trained", job)


def test_a_timing_cell_is_done_with_its_finished_job_run(tracker: Tracker, tmp_path: Path) -> None:
    """Cost cells evaluate nothing: no agent runs are needed."""
    run_dir = tmp_path / "runs" / "c0ffee12-hacpo"
    cell = _train_cell(run_dir, cost=True)
    _teams_done(run_dir, True, True)
    assert artifacts_status(cell, tracker) == ("trained", "")
    job = _job(tracker, cell.id)
    assert artifacts_status(cell, tracker) == ("done", job)
    assert artifacts_status(_train_cell(run_dir), tracker) == ("trained", job)  # not a cost cell


# -- cell_status: the row of a cell --------------------------------------------------------------


def _base_row(cell: Cell, **values: Any) -> dict[str, Any]:
    return {"cell": cell.id, "what": cell.label, "sweeps": ",".join(cell.sweeps), "run": "",
            "log": "", "seconds": None, "ended": None, **values}


def test_label_and_sweeps_of_the_cells_used_here(tmp_path: Path) -> None:
    assert _train_cell(tmp_path).label == "hacpo a+b s1 alpha=2"
    assert _base_cell().label == "base a+b s0"


def test_a_cell_without_state_or_artifacts_is_pending(tracker: Tracker, tmp_path: Path) -> None:
    cell = _train_cell(tmp_path / "runs" / "x")
    assert cell_status(cell, tmp_path / "sweep", tracker) == {
        "cell": "c0ffee12", "what": "hacpo a+b s1 alpha=2", "sweeps": "table1,table9",
        "run": "", "log": "", "seconds": None, "ended": None, "status": "pending", "error": ""}


def test_done_artifacts_win_over_the_state_file(tracker: Tracker, tmp_path: Path) -> None:
    """A failed state, but every evaluation is there: done, the artifacts' runs, no error."""
    sweep = tmp_path / "sweep"
    cell = _base_cell()
    run_a = _eval_run(tracker, "/zoo/model-a")
    run_b = _eval_run(tracker, "/zoo/model-b")
    _write_state(sweep, cell.id, {"status": "failed", "run": "old-run", "log": "/l/base.log",
                                  "seconds": 12.5, "ended": 99.0, "error": "boom",
                                  "phase": "training", "step": 1, "steps": 2, "started": 3.0})
    assert cell_status(cell, sweep, tracker) == {
        "cell": "base0cell", "what": "base a+b s0", "sweeps": "table1", "run": f"{run_a},{run_b}",
        "log": "/l/base.log", "seconds": 12.5, "ended": 99.0, "status": "done"}


def test_a_failed_cell_keeps_its_state_run_log_time_and_error(
        tracker: Tracker, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    cell = _train_cell(tmp_path / "runs" / "x")
    _write_state(sweep, cell.id, {"status": "failed", "run": "r-123", "log": "/l/c.log",
                                  "seconds": 7.0, "ended": 1234.0, "error": "CUDA OOM",
                                  "phase": "training", "step": 1, "steps": 2})
    assert cell_status(cell, sweep, tracker) == _base_row(
        cell, run="r-123", log="/l/c.log", seconds=7.0, ended=1234.0, status="failed",
        error="CUDA OOM")


def test_the_artifacts_job_run_wins_over_the_states_run(tracker: Tracker, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    run_dir = tmp_path / "runs" / "c0ffee12-hacpo"
    cell = _train_cell(run_dir)
    _teams_done(run_dir, True, True)
    job = _job(tracker, cell.id)
    _write_state(sweep, cell.id, {"status": "failed", "run": "r-old", "error": "lost"})
    assert cell_status(cell, sweep, tracker) == _base_row(cell, run=job, status="failed",
                                                           error="lost")


def test_a_running_cell_that_is_alive_shows_what_it_does(
        tracker: Tracker, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    cell = _train_cell(tmp_path / "runs" / "x")
    pid = os.getpid()
    _write_state(sweep, cell.id, {
        "status": "running", "host": socket.gethostname(), "pid": pid,
        "pid_token": process_token(pid), "run": "r-1", "log": "/l/c.log", "heartbeat": 0,
        "phase": "training", "step": 3, "steps": 20, "started": 1000.5, "cell": "ignored"})
    assert cell_status(cell, sweep, tracker) == _base_row(
        cell, run="r-1", log="/l/c.log", status="running", error="", phase="training", step=3,
        steps=20, started=1000.5)


def test_a_running_cell_copies_only_the_progress_fields_it_has(
        tracker: Tracker, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    cell = _train_cell(tmp_path / "runs" / "x")
    _write_state(sweep, cell.id, {"status": "running", "host": socket.gethostname(),
                                  "pid": os.getpid(), "phase": "evaluating"})
    assert cell_status(cell, sweep, tracker) == _base_row(
        cell, status="running", error="", phase="evaluating")


def test_a_running_cell_elsewhere_with_a_fresh_heartbeat_is_running(
        tracker: Tracker, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    cell = _train_cell(tmp_path / "runs" / "x")
    _write_state(sweep, cell.id, {"status": "running", "host": ELSEWHERE, "pid": 1,
                                  "heartbeat": time.time() + 3600, "step": 0})
    assert cell_status(cell, sweep, tracker) == _base_row(cell, status="running", error="",
                                                           step=0)


def test_a_running_cell_whose_process_is_gone_is_killed(tracker: Tracker, tmp_path: Path) -> None:
    """No progress fields for a killed cell; its error and log stay."""
    sweep = tmp_path / "sweep"
    cell = _train_cell(tmp_path / "runs" / "x")
    _write_state(sweep, cell.id, {"status": "running", "host": ELSEWHERE, "heartbeat": 0,
                                  "log": "/l/c.log", "error": "node lost", "phase": "training",
                                  "step": 3, "steps": 20, "started": 0})
    assert cell_status(cell, sweep, tracker) == _base_row(cell, log="/l/c.log", status="killed",
                                                           error="node lost")


def test_a_running_cell_of_a_dead_pid_here_is_killed(tracker: Tracker, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    cell = _train_cell(tmp_path / "runs" / "x")
    _write_state(sweep, cell.id, {"status": "running", "host": socket.gethostname(),
                                  "pid": _dead_pid(), "heartbeat": time.time() + 3600,
                                  "phase": "training"})
    assert cell_status(cell, sweep, tracker) == _base_row(cell, status="killed", error="")


def test_a_cell_done_by_its_state_but_without_artifacts_is_incomplete(
        tracker: Tracker, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    cell = _train_cell(tmp_path / "runs" / "x")
    _write_state(sweep, cell.id, {"status": "done", "run": "r-9", "seconds": 35.0,
                                  "phase": "training", "steps": 2})
    assert cell_status(cell, sweep, tracker) == _base_row(cell, run="r-9", seconds=35.0,
                                                           status="incomplete", error="")


@pytest.mark.parametrize("status", ["failed", "pending", "skipped"])
def test_other_states_pass_through(tracker: Tracker, tmp_path: Path, status: str) -> None:
    sweep = tmp_path / "sweep"
    cell = _train_cell(tmp_path / "runs" / "x")
    _write_state(sweep, cell.id, {"status": status, "phase": "training", "step": 1})
    assert cell_status(cell, sweep, tracker) == _base_row(cell, status=status, error="")


def test_a_damaged_state_file_is_pending(tracker: Tracker, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sweep"
    cell = _train_cell(tmp_path / "runs" / "x")
    _write_state(sweep, cell.id, ["running"])
    assert cell_status(cell, sweep, tracker) == _base_row(cell, status="pending", error="")
    assert "is not a hacrl state file" in capsys.readouterr().err


# -- a cell SLURM requeued: squeue decides ------------------------------------------------------


@pytest.fixture
def squeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, int, str], Path]:
    """A `squeue` first on PATH that prints `out` (and `err` on stderr) and exits `code`; it
    records its arguments in `<tmp>/squeue.args`."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")

    def make(out: str, code: int = 0, err: str = "") -> Path:
        script = folder / "squeue"
        script.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'squeue.args'}\n"
                          f"printf '%s' '{out}'\nprintf '%s' '{err}' >&2\nexit {code}\n")
        script.chmod(0o755)
        return tmp_path / "squeue.args"

    return make


@pytest.mark.parametrize(("out", "code", "err", "queued"), [
    ("PENDING\n", 0, "", True),
    ("RUNNING\n", 0, "", True),
    ("REQUEUED\n", 0, "", True),
    ("COMPLETED\nCANCELLED\n", 0, "", False),  # every listed state is final: gone
    ("COMPLETED\nPENDING\n", 0, "", True),     # an array: one task still waits
    ("", 0, "", False),                        # squeue lists nothing: gone
    ("", 1, "slurm_load_jobs error: Invalid job id specified", False),
    ("", 1, "slurm_load_jobs error: Unable to contact slurm controller", None),
])
def test_slurm_queued_asks_squeue_about_the_job(squeue: Callable[..., Path], out: str, code: int,
                                                err: str, queued: bool | None) -> None:
    args = squeue(out, code, err)
    assert state.slurm_queued("46_1") is queued
    assert args.read_text().split() == ["-h", "-j", "46_1", "-o", "%T"]


@pytest.mark.parametrize("final", ["COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
                                   "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"])
def test_a_job_in_a_final_state_is_no_longer_queued(squeue: Callable[..., Path],
                                                    final: str) -> None:
    squeue(f"{final}\n")
    assert state.slurm_queued("46") is False
    squeue(f"{final}\nRUNNING\n")  # an array with a task still running
    assert state.slurm_queued("46") is True


def test_a_squeue_that_does_not_answer_cannot_tell(squeue: Callable[..., Path], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    squeue("PENDING\n")
    hung = tmp_path / "bin" / "squeue"
    hung.write_text("#!/bin/sh\nexec sleep 60\n")  # a controller that never answers
    monkeypatch.setattr(state, "SQUEUE_TIMEOUT_S", 0.2)
    assert state.slurm_queued("46") is None


def test_slurm_queued_without_a_job_or_without_squeue(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    assert state.slurm_queued("") is False  # no job to wait for
    monkeypatch.setenv("PATH", str(tmp_path))  # no squeue here: cannot tell
    assert state.slurm_queued("46") is None


@pytest.mark.parametrize(("out", "code", "err", "status"), [
    ("PENDING\n", 0, "", "running"),       # waits in the queue to resume
    ("", 1, "Invalid job id specified", "killed"),  # SLURM forgot it: it will not come back
    ("", 1, "Unable to contact slurm controller", "running"),  # cannot tell: trust the file
])
def test_a_requeued_cell_runs_while_slurm_holds_its_job(
        tracker: Tracker, tmp_path: Path, squeue: Callable[..., Path], out: str, code: int,
        err: str, status: str) -> None:
    sweep = tmp_path / "sweep"
    cell = _train_cell(tmp_path / "runs" / "x")
    asked = squeue(out, code, err)
    _write_state(sweep, cell.id, {"status": "requeued", "slurm_job": "46_1", "host": ELSEWHERE,
                                  "pid": 1, "phase": "training", "step": 7, "steps": 20,
                                  "started": 1000.5, "log": "/l/c.log"})
    row = cell_status(cell, sweep, tracker)
    expected = _base_row(cell, log="/l/c.log", status=status, error="")
    if status == "running":
        expected.update(phase="requeued", step=7, steps=20, started=1000.5)
    assert row == expected
    if status == "running":
        assert phase_text(row) == "requeued after step 7"
    assert asked.read_text().split() == ["-h", "-j", "46_1", "-o", "%T"]  # about its own job


def test_a_requeued_cell_without_its_job_id_is_killed_without_asking(
        tracker: Tracker, tmp_path: Path, squeue: Callable[..., Path]) -> None:
    sweep = tmp_path / "sweep"
    cell = _train_cell(tmp_path / "runs" / "x")
    asked = squeue("PENDING\n")  # squeue would say "queued" about any job
    _write_state(sweep, cell.id, {"status": "requeued", "step": 7})
    assert cell_status(cell, sweep, tracker)["status"] == "killed"
    assert not asked.exists()


# -- phase_text and progress_text ----------------------------------------------------------------


@pytest.mark.parametrize(("fields", "text"), [
    ({"phase": "training", "step": 12, "steps": 20}, "training step 12/20"),
    ({"phase": "training", "steps": 20}, "training step 0/20"),
    ({"phase": "training", "step": 5}, "training"),
    ({"phase": "training", "step": 5, "steps": 0}, "training"),
    ({"phase": "evaluating", "step": 3, "steps": 20}, "evaluating"),
    ({"phase": "setup"}, "setup"),
    ({"step": 3, "steps": 20}, "starting"),
    ({"phase": ""}, "starting"),
    ({"phase": None}, "starting"),
    ({}, "starting"),
    ({"phase": "requeued", "step": 7, "steps": 20}, "requeued after step 7"),
    ({"phase": "requeued", "step": 0}, "requeued"),
    ({"phase": "requeued"}, "requeued"),
])
def test_phase_text(fields: dict[str, Any], text: str) -> None:
    assert phase_text(fields) == text


@pytest.mark.parametrize(("row", "text"), [
    ({"status": "running", "phase": "training", "step": 12, "steps": 20, "started": NOW - 31},
     "training step 12/20, 31 s"),
    ({"status": "running", "phase": "training", "step": 4, "steps": 20, "started": NOW - 65},
     "training step 4/20, 1:05"),
    ({"status": "running", "phase": "evaluating", "started": int(NOW) - 3729}, "evaluating, 1:02:09"),
    ({"status": "running", "started": NOW}, "starting, 0 s"),
    ({"status": "running", "phase": "training", "step": 1, "steps": 2}, "training step 1/2"),
    ({"status": "running", "phase": "training", "started": "yesterday"}, "training"),
    ({"status": "running", "seconds": 35.0}, "starting"),
    ({"status": "done", "seconds": 34.6, "started": NOW - 65, "phase": "training"}, "35 s"),
    ({"status": "failed", "seconds": 7}, "7 s"),
    ({"seconds": 0.2}, "0 s"),
    ({"status": "done", "seconds": "35"}, ""),
    ({"status": "done", "seconds": None}, ""),
    ({"status": "done"}, ""),
    ({}, ""),
])
def test_progress_text(clock: None, row: dict[str, Any], text: str) -> None:
    assert progress_text(row) == text


# -- format_table ----------------------------------------------------------------------------------

HEADER = ("status" + " " * 6 + "cell" + " " * 10 + "what" + " " * 42 + "progress" + " " * 20
          + "run" + " " * 31 + "log")


def _line(status: str, cell: str, what: str, progress: str, run: str, log: str) -> str:
    """A row: status 10, cell 12, what 44, progress 26 and run 32 wide, two spaces apart."""
    return (status.ljust(10) + "  " + cell.ljust(12) + "  " + what.ljust(44) + "  "
            + progress.ljust(26) + "  " + run.ljust(32) + "  " + log)


def test_format_table_of_no_rows_is_the_header() -> None:
    assert format_table([]) == HEADER
    assert len(HEADER) == 10 + 2 + 12 + 2 + 44 + 2 + 26 + 2 + 32 + 2 + len("log")


def test_format_table_rows_exactly(clock: None) -> None:
    rows: list[dict[str, Any]] = [
        {"status": "done", "cell": "c1", "what": "gspo a s0", "seconds": 34.6, "run": "r1",
         "log": "/out/sweeps/t/cells/c1.log", "error": "ignored when done"},
        {"status": "running", "cell": "c2", "what": "hacpo a+b s0", "phase": "training",
         "step": 4, "steps": 20, "started": NOW - 65, "run": "r2", "log": ""},
        {"status": "pending", "cell": "c3", "what": "hacpo a+b s1"},
    ]
    assert format_table(rows).split("\n") == [
        HEADER,
        _line("done", "c1", "gspo a s0", "35 s", "r1", "/out/sweeps/t/cells/c1.log"),
        _line("running", "c2", "hacpo a+b s0", "training step 4/20, 1:05", "r2", ""),
        _line("pending", "c3", "hacpo a+b s1", "", "", ""),
    ]
    assert format_table(rows[2:]) == (
        HEADER + "\n" + "pending" + " " * 5 + "c3" + " " * 12 + "hacpo a+b s1" + " " * 34
        + " " * 28 + " " * 34)


def test_format_table_keeps_44_characters_of_what_and_cuts_longer_with_dots() -> None:
    exact = "w" * 44
    longer = "abcdefghij" * 4 + "klmno"  # 45 characters
    table = format_table([{"status": "done", "cell": "c1", "what": exact},
                          {"status": "done", "cell": "c2", "what": longer}])
    assert table.split("\n")[1:] == [
        _line("done", "c1", exact, "", "", ""),
        _line("done", "c2", "abcdefghij" * 4 + "k" + "...", "", "", ""),
    ]
    assert len(table.split("\n")[2]) == len(HEADER) - len("log")


def test_format_table_cuts_the_run_to_32_characters_and_keeps_other_values_whole() -> None:
    run = "0123456789abcdef" * 2 + "XYZ"  # 35 characters
    row = {"status": "incomplete", "cell": "cell-id-longer-than-12", "what": "w", "run": run,
           "log": "l"}
    assert format_table([row]).split("\n")[1] == (
        "incomplete  cell-id-longer-than-12  w" + " " * 43 + "  " + " " * 26 + "  "
        + "0123456789abcdef" * 2 + "  l")


def test_format_table_of_an_empty_row_is_blank_columns() -> None:
    assert format_table([{}]).split("\n") == [HEADER, _line("", "", "", "", "", "")]


@pytest.mark.parametrize("status", ["failed", "killed"])
def test_format_table_adds_the_error_of_a_failed_or_killed_cell(status: str) -> None:
    table = format_table([{"status": status, "cell": "c1", "what": "w", "error": "CUDA OOM: x"},
                          {"status": "done", "cell": "c2", "what": "v"}])
    assert table.split("\n") == [HEADER, _line(status, "c1", "w", "", "", ""),
                                 " " * 12 + "error: CUDA OOM: x", _line("done", "c2", "v", "", "", "")]


@pytest.mark.parametrize("row", [
    {"status": "failed", "cell": "c1", "error": ""},      # no error text
    {"status": "failed", "cell": "c1"},
    {"status": "pending", "cell": "c1", "error": "old"},  # only failed and killed rows show it
    {"status": "incomplete", "cell": "c1", "error": "old"},
    {"status": "running", "cell": "c1", "error": "old"},
    {"status": "done", "cell": "c1", "error": "old"},
])
def test_format_table_shows_no_error_line_otherwise(row: dict[str, Any]) -> None:
    table = format_table([row])
    assert table.split("\n") == [HEADER, _line(row["status"], "c1", "", progress_text(row), "",
                                               "")]


def test_module_constants() -> None:
    """The heartbeat is well inside the deadline (what `alive` elsewhere relies on)."""
    assert (state.HEARTBEAT_S, state.DEADLINE_S) == (30.0, 300.0)
