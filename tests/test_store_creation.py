"""Creating a brand-new MLflow store survives a kill and a full disk (issue 39): the store is made
and migrated under a temporary name and renamed into place, so the output root holds either no
store or a whole one; a half-created store left by an earlier version (no runs) is set aside and
made again; a store with runs is never touched. Each case runs the real code in a process of
its own (`open_client`, as every writer opens a store)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hacrl.core.errors import StoreError
from hacrl.tracking.mlflow_store import CREATING, SET_ASIDE, _head_revision, open_client, sqlite_uri

OPEN = """
import sys
from pathlib import Path
from hacrl.core.errors import StoreError
from hacrl.tracking.mlflow_store import open_client, sqlite_uri
try:
    with open_client(sqlite_uri(Path(sys.argv[1]))) as client:
        print("experiments", len(client.search_experiments()))
except StoreError as err:
    print("hacrl:", err, file=sys.stderr)
    sys.exit(1)
"""


def _open(db: Path, **popen: object) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return subprocess.Popen([sys.executable, "-c", OPEN, str(db)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)  # type: ignore[call-overload]


def _complete(db: Path) -> bool:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT version_num FROM alembic_version").fetchone()[0] == _head_revision()


def _kill_while_creating(db: Path, after_s: float) -> list[str]:
    """Start a writer on a store that does not exist, SIGKILL it `after_s` seconds after its
    temporary store appears (or at once when negative); the files left in the folder."""
    writer = _open(db)
    if after_s >= 0:
        deadline = time.monotonic() + 120
        while not list(db.parent.glob(f"{db.name}{CREATING}*")) and writer.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        time.sleep(after_s)
    writer.send_signal(signal.SIGKILL)
    writer.communicate()
    return sorted(p.name for p in db.parent.iterdir())


@pytest.fixture(scope="module")
def creation_s(tmp_path_factory: pytest.TempPathFactory) -> float:
    """How long this machine takes from the temporary store's appearance to the rename, so the
    kills land inside creation on a fast machine and a slow one alike."""
    db = tmp_path_factory.mktemp("timing") / "mlflow.db"
    writer = _open(db)
    deadline = time.monotonic() + 120
    while not list(db.parent.glob(f"{db.name}{CREATING}*")) and writer.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.002)
    started = time.monotonic()
    while not db.exists() and writer.poll() is None:
        time.sleep(0.002)
    took = time.monotonic() - started
    writer.communicate(timeout=120)
    assert writer.returncode == 0 and db.exists()
    return took


@pytest.mark.parametrize("fraction", [0.0, pytest.param(0.05, marks=pytest.mark.slow),
                                      pytest.param(0.3, marks=pytest.mark.slow),
                                      pytest.param(0.8, marks=pytest.mark.slow)])
def test_a_writer_killed_while_it_creates_the_store_leaves_no_store_and_the_next_one_works(
        tmp_path: Path, request: pytest.FixtureRequest, fraction: float) -> None:
    after_s = fraction * request.getfixturevalue("creation_s") if fraction else 0.0
    db = tmp_path / "out" / "mlflow.db"
    left = _kill_while_creating(db, after_s)
    if "mlflow.db" in left:  # a noisy machine let the writer reach the rename: then it is whole
        assert fraction > 0 and _complete(db), left
    else:  # killed before the rename: never half a store in place
        assert any(name.startswith(f"mlflow.db{CREATING}") for name in left), left
    again = _open(db)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert out.strip() == "experiments 1" and err.strip() == ""
    assert _complete(db)
    assert sorted(p.name for p in db.parent.iterdir()) == ["mlflow.db", "mlflow.db.lock"]


def test_a_half_created_store_without_runs_is_set_aside_and_made_again(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    with open_client(sqlite_uri(db)):
        pass
    with sqlite3.connect(db) as con:  # as a kill mid-migration leaves it: an older revision
        con.execute("UPDATE alembic_version SET version_num = 'b7e2c1a4d9f3'")
    before = db.read_bytes()
    writer = _open(db)
    out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0 and out.strip() == "experiments 1", err
    assert err.strip().startswith(f"hacrl: the MLflow store {db} was half-created (schema "
                                  "b7e2c1a4d9f3, no runs")
    assert len(err.strip().splitlines()) == 1
    aside = [p for p in tmp_path.iterdir() if SET_ASIDE in p.name]
    assert len(aside) == 1 and aside[0].read_bytes() == before  # moved, not deleted
    assert _complete(db)


def test_a_store_with_runs_is_never_touched(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    with open_client(sqlite_uri(db)) as client:
        client.create_run("0")
    with sqlite3.connect(db) as con:
        con.execute("UPDATE alembic_version SET version_num = 'b7e2c1a4d9f3'")
    before = db.read_bytes()
    with pytest.raises(StoreError) as caught:
        with open_client(sqlite_uri(db)):
            pass
    message = str(caught.value)
    assert "\n" not in message and f"the MLflow store {db} is not complete" in message
    assert "it holds 1 runs, so hacrl leaves it as it is" in message
    assert f"mlflow db upgrade {sqlite_uri(db)}" in message
    assert db.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if SET_ASIDE in p.name] == []


def test_a_reader_does_not_repair_a_half_created_store(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    with open_client(sqlite_uri(db)):
        pass
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM alembic_version")
    before = db.read_bytes()
    with pytest.raises(StoreError, match="no schema version.*a training job or sweep on this "
                                         "output root creates it again"):
        with open_client(sqlite_uri(db), create=False):
            pass
    assert db.read_bytes() == before


def _no_bigger_files(limit: int) -> None:
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_full_disk_while_creating_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    writer = _open(db, preexec_fn=lambda: _no_bigger_files(64 * 1024))
    out, err = writer.communicate(timeout=120)
    assert writer.returncode == 1, out + err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"hacrl: cannot create the MLflow store {db} (")
    assert "nothing was written: free space in (or fix)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db.lock"]
    again = _open(db)  # with room again, the next writer creates it
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0 and out.strip() == "experiments 1", err
