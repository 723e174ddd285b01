"""Atomic writes keep the umask's mode; a cell stopped by SIGTERM is recorded as killed."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hacrl.core.fileio import sha256_file, write_atomic, write_json


def test_atomic_files_are_readable_like_any_other_file(tmp_path: Path) -> None:
    """Other users of a shared output root read DONE.json, manifests and cell states."""
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    write_json(tmp_path / "deep" / "state.json", {"a": 1})
    write_atomic(tmp_path / "lines.jsonl", (f"{i}\n" for i in range(3)))
    for path in (tmp_path / "deep" / "state.json", tmp_path / "lines.jsonl"):
        assert path.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
    assert json.loads((tmp_path / "deep" / "state.json").read_text()) == {"a": 1}
    assert (tmp_path / "lines.jsonl").read_text() == "0\n1\n2\n"
    assert [p.name for p in tmp_path.rglob("*.tmp")] == []
    assert len(sha256_file(plain)) == 64


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "DONE.json"
    write_atomic(path, "old")

    def pieces():
        yield "new, half"
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_atomic(path, pieces())
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["DONE.json"]


def test_a_cell_stopped_by_sigterm_is_killed_not_failed(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import hacrl.config
    import hacrl.job
    from hacrl.job import lock
    from hacrl.job.lock import on_sigterm
    from hacrl.sweep.cell_run import run_cell
    from hacrl.sweep.state import cell_state_path

    def terminated(spec: object, progress: bool, report: object = None) -> dict:
        on_sigterm(signal.SIGTERM, None)  # what the job's handler does when SLURM stops it
        return {}

    monkeypatch.setattr(hacrl.config, "validate", lambda cfg: cfg)
    monkeypatch.setattr(hacrl.job, "before_job", lambda cfg: None)
    monkeypatch.setattr(hacrl.job, "run_job", terminated)
    monkeypatch.setattr(lock, "_terminate_requested", False)  # this process's jobs go on after
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # nor is SIGTERM ignored from now on
    cfg = OmegaConf.create({"cell": {"id": "c1"}})
    with pytest.raises(BaseException) as caught:
        run_cell(cfg, tmp_path)
    assert type(caught.value).__name__ == "Terminated"
    state = json.loads(cell_state_path(tmp_path, "c1").read_text())
    assert state["status"] == "killed" and state["pid"] == os.getpid()


def test_a_sigterm_swallowed_in_a_finalizer_still_ends_the_job(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM handled inside a weakref callback (SQLAlchemy's state cleanup, in a warm cell
    whose sweep was killed) raises where Python prints "Exception ignored" and goes on; the job
    must still see it at its next check instead of training to the end."""
    import weakref

    from hacrl.job import lock

    monkeypatch.setattr(lock, "_terminate_requested", False)
    previous = signal.signal(signal.SIGTERM, lock.on_sigterm)
    try:
        lock.raise_if_terminated()  # nothing asked yet

        class Thing:
            pass

        thing = Thing()
        ref = weakref.ref(thing, lambda _: os.kill(os.getpid(), signal.SIGTERM))
        del thing  # the handler runs inside the callback: its exception goes nowhere
        assert ref() is None
        with pytest.raises(lock.Terminated):
            lock.raise_if_terminated()
    finally:
        signal.signal(signal.SIGTERM, previous)
