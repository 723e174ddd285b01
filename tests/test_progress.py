"""Progress with an ETA: the helpers, the zoo/data item lines, the sweep's live table on a
terminal and in a log, and what a job reports while it runs."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from hacrl.core.eta import ItemProgress, duration, eta_seconds
from hacrl.sweep.grid import Cell
from hacrl.sweep.progress import LiveProgress, Tally, done_share
from hacrl.sweep.state import cell_state_path, format_table, phase_text


def test_duration_and_eta() -> None:
    assert [duration(s) for s in (0, 42.4, 185, 3729)] == ["0 s", "42 s", "3:05", "1:02:09"]
    assert eta_seconds(0, 10, 5) is None  # nothing done: no guess
    assert eta_seconds(2, 10, 20) == pytest.approx(80)
    assert eta_seconds(10, 10, 20) == 0


def test_item_lines_count_and_weigh() -> None:
    out = io.StringIO()
    shown = ItemProgress("zoo", ["a", "b", "c"], {"a": 1, "b": 1, "c": 2}, out=out)
    shown.started -= 10  # as if a took 10 s
    shown.finished("a", "built")
    shown.finished("b", "built")
    shown.finished("c", "built")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[zoo] 1/3 a: built (10 s, ETA 30 s)")  # 1 of 4 units in 10 s
    assert lines[1].startswith("[zoo] 2/3 b: built (10 s, ETA 10 s)")  # 2 of 4 units
    assert lines[2] == "[zoo] 3/3 c: built (10 s)"  # the last line has no ETA


def _cell(cid: str, estimate: float = 1.0, cost: bool = False) -> Cell:
    return Cell(id=cid, overrides=[f"seed={cid}"], method="hacpo", agents=["a", "b"], seed=0,
                sweeps=["t"], protocols=["main"], cost=cost, estimate=estimate, trains=True,
                run_dir=f"/runs/{cid}", model_paths={}, protocol_keys={"main": "k"},
                benchmarks=["x"], scale="tiny", params={})


def _state(sweep: Path, cid: str, **fields: object) -> None:
    path = cell_state_path(sweep, cid)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cell": cid, "status": "running", **fields}))


def test_phase_and_share_of_a_running_cell() -> None:
    assert phase_text({"phase": "training", "step": 12, "steps": 20}) == "training step 12/20"
    assert phase_text({"phase": "evaluating"}) == "evaluating" and phase_text({}) == "starting"
    assert done_share({"phase": "training", "step": 10, "steps": 20}, True) == 0.375
    assert done_share({"phase": "evaluating"}, True) == 0.75
    assert done_share({"phase": "evaluating"}, False) == 0.0


def test_tally_eta_counts_running_work_and_weighs_timing_cells() -> None:
    cells = [_cell("a", 2.0), _cell("b", 2.0), _cell("c", 1.0, cost=True), _cell("d", 9.0)]
    tally = Tally(cells, parallel=2)
    assert tally.weight["c"] == 2.0  # the timing cell runs alone: its cost counts twice
    line = tally.summary("t", {"a": "done", "b": "running", "c": "pending", "d": "skipped"},
                         {"b": {"phase": "training", "step": 2, "steps": 3}},
                         {c.id: c for c in cells}, elapsed=60.0)
    # done: 2 + 2 * 0.75 * 2/3 = 3 of 6 units in 60 s: 60 s to go (d was done before: no time)
    assert line == "t: 2 done, 1 running, 1 pending · 1:00 elapsed · ETA 1:00"


def test_live_table_on_a_terminal_redraws_below_the_finished_lines(tmp_path: Path) -> None:
    cells = [_cell("a"), _cell("b"), _cell("c")]
    out = io.StringIO()
    live = LiveProgress("t", cells, tmp_path, parallel=2, out=out, tty=True)
    live.interval = 0.05
    with live:
        live.started_cell("a")
        live.started_cell("b")
        _state(tmp_path, "a", phase="training", step=3, steps=20, started=time.time() - 5)
        _state(tmp_path, "b", phase="evaluating", started=time.time())
        time.sleep(0.3)
        drawn = out.getvalue()
        live.finished_cell(cells[0], "done", 12.0)
        live.note("timing cells: 1 alone")  # the sweep's own lines go above the block
    text = out.getvalue()
    assert "\x1b[J[hacrl sweep] timing cells: 1 alone\n[hacrl sweep] t: 1 done" in text
    assert "[hacrl sweep] t: 0 done, 2 running, 1 pending" in drawn
    assert "training step 3/20  5 s" in drawn and "evaluating" in drawn
    assert "\x1b[3F\x1b[J" in text  # the 3-line block erased before it is drawn again
    assert "[hacrl sweep] [1/3] done   a " in text
    # after the exit nothing of the block is left on the screen below the last line
    assert live._drawn == 0


def test_live_table_in_a_log_prints_plain_lines(tmp_path: Path) -> None:
    cells = [_cell("a"), _cell("b")]
    out = io.StringIO()
    live = LiveProgress("t", cells, tmp_path, parallel=1, skipped=["b"], out=out, tty=False)
    live.interval = 0.05
    with live:
        live.started_cell("a")
        _state(tmp_path, "a", phase="training", step=1, steps=4)
        time.sleep(0.2)
        live.finished_cell(cells[0], "done", 3.0)
    text = out.getvalue()
    assert "\x1b" not in text
    assert "[hacrl sweep] t: 1 done, 1 running, 0 pending · 0 s elapsed" in text
    assert " | running a hacpo a+b s0 training step 1/4" in text
    assert "[hacrl sweep] [1/1] done   a " in text  # the skipped cell is not counted to run


def test_status_table_shows_what_a_running_cell_does() -> None:
    rows = [{"status": "running", "cell": "a", "what": "hacpo size s0", "phase": "training",
             "step": 4, "steps": 20, "started": time.time() - 65},
            {"status": "done", "cell": "b", "what": "gspo size s0", "seconds": 35.2}]
    table = format_table(rows)
    assert "training step 4/20, 1:05" in table and " 35 s " in table


def test_cells_queued_in_slurm_count_as_pending_until_their_job_begins(tmp_path: Path) -> None:
    """A job array marks every cell started at submit; SLURM runs a few at a time. A cell whose
    job has not written its state yet is pending in the block, as in `hacrl status`."""
    cells = [_cell("a"), _cell("b"), _cell("c")]
    live = LiveProgress("t", cells, tmp_path, parallel=2, out=io.StringIO(), tty=False)
    for cell in cells:
        live.started_cell(cell.id)
    _state(tmp_path, "a", phase="training", step=2, steps=20)
    _state(tmp_path, "c", status="done")
    lines = live.lines()
    assert lines[0].startswith("[hacrl sweep] t: 1 done, 1 running, 1 pending · ")
    assert len(lines) == 2 and " a " in lines[1] and "training step 2/20" in lines[1]
