"""A moved or copied output root works where it is now (issue 39): its store's artifact
locations are re-based onto the folder beside its database (by the first writer to open it;
readers map them the same way), its sweep manifests' run folders and store re-based onto the
root they are read from, and nothing is read from or written to the old root."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from hacrl.schema.sweep_manifest import CellRecord, SweepManifest, write_manifest
from hacrl.tracking import Tracker
from hacrl.tracking.mlflow_store import sqlite_uri


def _snapshot(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*"))


def _locations(db: Path) -> list[str]:
    with sqlite3.connect(db) as con:
        return [r[0] for r in con.execute("SELECT artifact_location FROM experiments "
                                          "UNION ALL SELECT artifact_uri FROM runs")]


def test_a_copied_store_reads_and_writes_its_own_artifacts(tmp_path: Path) -> None:
    from analysis.store import open_store

    old = tmp_path / "old root"
    tracker = Tracker(sqlite_uri(old / "mlflow.db"), "hacrl-tiny")
    run = tracker.start_run("a", {"hacrl.kind": "job"})
    note = tmp_path / "note.txt"
    note.write_text("old")
    tracker.log_artifact(run, note)
    tracker.finish(run)
    new = tmp_path / "copy"
    shutil.copytree(old, new)
    (next(new.glob("mlartifacts/**/note.txt"))).write_text("copy")
    before = _snapshot(old)

    # a reader (report, --no-mlflow) before any writer opened the copy: the copy's file
    reader = open_store(sqlite_uri(new / "mlflow.db"), "hacrl-tiny")
    found = reader.artifact(run, "note.txt")
    assert found is not None and found.read_text() == "copy" and new in found.parents

    # the first writer re-bases the copy's locations; a new run's artifacts land in the copy
    again = Tracker(sqlite_uri(new / "mlflow.db"), "hacrl-tiny")
    assert all(str(old.name).replace(" ", "%20") not in loc for loc in _locations(new / "mlflow.db")
               if "mlartifacts" in loc)
    assert any((new / "mlartifacts").resolve().as_uri() in loc
               for loc in _locations(new / "mlflow.db"))
    second = again.start_run("b", {"hacrl.kind": "job"})
    again.log_artifact(second, note)
    again.finish(second)
    assert len(list(new.glob("mlartifacts/**/note.txt"))) == 2
    assert _snapshot(old) == before  # nothing read-modified or written in the old root

    # moved again (renamed): opened in its new place, re-based again
    moved = tmp_path / "moved"
    new.rename(moved)
    Tracker(sqlite_uri(moved / "mlflow.db"), "hacrl-tiny")
    assert not new.exists()
    store = open_store(sqlite_uri(moved / "mlflow.db"), "hacrl-tiny")
    path = store.artifact(run, "note.txt")
    assert path is not None and moved in path.parents


def test_a_moved_sweep_manifest_is_read_in_its_new_root(tmp_path: Path) -> None:
    from hacrl.sweep.state import read_cells

    old = tmp_path / "old"
    cell = CellRecord(id="abc", overrides=[], method="hacpo", agents=["a"], seed=0,
                      run_dir=str(old / "runs" / "abc-hacpo"))
    write_manifest(old / "sweeps" / "mini", SweepManifest(
        sweep="mini", cells=[cell], tracking_uri=sqlite_uri(old / "mlflow.db")))
    new = tmp_path / "new ?%"
    old.rename(new)
    manifest, cells = read_cells(new / "sweeps" / "mini")
    assert manifest is not None
    assert manifest.tracking_uri == sqlite_uri(new / "mlflow.db")
    assert [c.run_dir for c in cells] == [str(new / "runs" / "abc-hacpo")]
    elsewhere = tmp_path / "store-elsewhere.db"  # a store outside the root is not re-based
    write_manifest(new / "sweeps" / "mini", SweepManifest(
        sweep="mini", cells=[cell], tracking_uri=sqlite_uri(elsewhere)))
    manifest, _ = read_cells(new / "sweeps" / "mini")
    assert manifest is not None and manifest.tracking_uri == sqlite_uri(elsewhere)


def test_only_run_folders_under_the_old_root_are_rebased(tmp_path: Path) -> None:
    """Cells not run yet (no run folder) and a run folder outside any `runs/` stay as they are;
    the one under the old root's `runs/` follows the root."""
    from hacrl.sweep.state import read_rebased_manifest

    old, new = tmp_path / "old", tmp_path / "new"
    outside = str(tmp_path / "elsewhere" / "jobs" / "c3-gspo")
    cells = [CellRecord(id="c1", overrides=[], method="hacpo", agents=["a"], seed=0,
                        run_dir=str(old / "runs" / "c1-hacpo")),
             CellRecord(id="c2", overrides=[], method="gspo", agents=["a"], seed=0, run_dir=""),
             CellRecord(id="c3", overrides=[], method="gspo", agents=["b"], seed=0,
                        run_dir=outside)]
    write_manifest(old / "sweeps" / "mini", SweepManifest(
        sweep="mini", cells=cells, tracking_uri=sqlite_uri(old / "mlflow.db")))
    old.rename(new)
    manifest = read_rebased_manifest(new / "sweeps" / "mini")
    assert manifest is not None
    assert [c.run_dir for c in manifest.cells] == [str(new / "runs" / "c1-hacpo"), "", outside]
    assert manifest.tracking_uri == sqlite_uri(new / "mlflow.db")
