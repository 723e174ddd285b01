"""Opening an MLflow store safely: its URI, checks before MLflow starts, the lock around first
use, retries. `hacrl.tracking.Tracker` writes through it; `analysis.store` reads through it.

The default store is `sqlite:///<output_root>/mlflow.db` (`resolve_uri`; the path from
`hacrl.core.layout`); `MLFLOW_TRACKING_URI` or `tracking.uri` point elsewhere (e.g. an `mlflow server`).

Safety of the store (issue 16), the choices and why:

- **One lock around first use.** MLflow creates and migrates a sqlite store's tables the first
  time a process opens it (`SqlAlchemyStore.__init__`), without an inter-process lock: 8 jobs on a
  brand-new store crash (`duplicate column name`, alembic errors), and two creating the
  experiment at once hit `UNIQUE constraint failed`. Every entry point opens the store through
  `open_client` (Tracker: train, Hydra multirun, eval, sweep, report logging; `open_store`: the
  read side), which holds an exclusive `fcntl.flock` on `<db>.lock` next to the database while
  MLflow opens it and while the experiment is read or created. The lock lives next to the db,
  not in /tmp, so jobs on several hosts sharing an output root see the same lock (flock works
  across NFS clients on Linux; Lustre needs its `flock` mount option). The wait for it is
  bounded (`LOCK_WAIT_S`). A server URI takes no file lock (the server serialises its own
  writes); a lost race on `create_experiment` is recovered there too by re-reading by name.
- **Rollback journal, not WAL.** WAL lets readers and one writer overlap and commits faster
  (scripts/stress_store.py, 8 writers x 200 single-point calls: ~20-28 s with WAL, ~40 s
  without), but both lose nothing and need no retry there. WAL needs shared memory, which
  network filesystems do not provide (SQLite: "WAL does not work over a network filesystem"),
  and that is where a cluster's output root lives; a WAL database cannot be read from a
  read-only folder (it needs its -shm file), so an archived store could not be reported on; and
  while a process holds it open, recent commits sit in the -wal file, so copying `mlflow.db`
  alone (as the tests' template store is) loses them. So the store keeps SQLite's default
  journal; many writers at speed belong on an `mlflow server`.
- **Busy timeout and a bounded retry.** MLflow sets `PRAGMA busy_timeout = 20000` on every
  session it opens (mlflow/store/db/utils.py), so a writer waits up to 20 s for another's
  transaction; SQLite still answers "database is locked" at once where waiting could deadlock.
  Tracker retries a call that fails so (the failed transaction was rolled back, so a retry
  writes once) `LOCKED_RETRIES` times with jittered backoff (at most ~5 s of sleeps, and 20 s of
  busy wait per try), then raises StoreError.
- **A path with any characters.** SQLAlchemy percent-decodes the database part of the URL and
  cuts it at the first `?`, so `sqlite_uri` encodes `%` and `?` (and nothing else, so an
  ordinary path's URI is unchanged) and `sqlite_path` inverts it the same way. MLflow makes the
  db's folder from the still-encoded text; the folders that creates are removed again.
- **Faults are one line, fast.** Before MLflow starts (it retries a failing sqlite engine for
  ~100 s and a refused HTTP connection for ~255 s) the store is checked: the URI's scheme, a
  sqlite folder that cannot be created or written, a read-only db file or one that is not a
  SQLite database, a server that does not answer `GET <uri>/health` within `PROBE_TIMEOUT_S`. Each raises StoreError naming the URI or
  path and what to do. MLflow's own HTTP retries are bounded by `HTTP_BOUNDS` (set with
  setdefault: a user's own setting wins).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from hacrl.core.errors import StoreError, one_line
from hacrl.core.layout import Layout, artifacts_beside

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

SQLITE_PREFIX = "sqlite:///"
# a brand-new store takes ~10 s to create on a slow machine; 8+ jobs queue behind it, and the
# holder of the lock is alive (flock dies with its process), so a long wait means a stuck peer
LOCK_WAIT_S = 600.0
PROBE_TIMEOUT_S = 5.0
# retries after "database is locked": sleeps 0.1, 0.2, 0.4, 0.8, 1.6 s times a jitter of
# 0.5-1.5, so at most ~4.7 s of sleeping (plus MLflow's 20 s busy wait in each of the 6 tries)
LOCKED_RETRIES = 5
# MLflow's defaults retry a refused connection 7 times with backoff factor 2 (~255 s). These
# bound one call to 4 retries sleeping 0, 2, 4, 8 s (+ up to 1 s jitter each: under 20 s) for a
# server that refuses, and 60 s per try for one that hangs; still enough for a brief restart.
HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "4", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "60"}
ARTIFACTS_DIR = "/" + artifacts_beside(Path("x")).name  # "/mlartifacts": a location's own folder
# the artifact root MLflow gives a sqlite store it opens itself (its Default experiment's folder)
DEFAULT_ARTIFACTS = "./mlruns"
STORE_HELP = "pass output_root=... or tracking.uri=... (e.g. sqlite:///<path>/mlflow.db)"


def sqlite_uri(db: Path) -> str:
    """The URI of the sqlite file at exactly `db`, whatever characters its path holds."""
    # SQLAlchemy percent-decodes the database part and ends it at the first '?': escape just
    # those two, so the URI of an ordinary path stays `sqlite:///<path>`
    return SQLITE_PREFIX + str(db).replace("%", "%25").replace("?", "%3F")


def sqlite_path(uri: str) -> Path | None:
    """The file a `sqlite:///` URI opens (decoded as SQLAlchemy does); None for other stores."""
    if not uri.startswith(SQLITE_PREFIX):
        return None
    database = uri.removeprefix(SQLITE_PREFIX).split("?", 1)[0]
    if not database or database == ":memory:":
        return None
    return Path(unquote(database))


def resolve_uri(configured: str | None, output_root: Path) -> str:
    """The store a job uses: `tracking.uri`, else MLFLOW_TRACKING_URI, else
    `<output_root>/mlflow.db`."""
    if configured:
        return configured
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return sqlite_uri(Layout(output_root).store_db)


def check_store(uri: str) -> None:
    """The store checks of `open_client` for a writer, without importing MLflow: a command
    calls it before its heavy imports, so a bad store is one line within seconds."""
    scheme = _known_scheme(uri)
    db = sqlite_path(uri)
    if db is not None:
        _check_sqlite(db, create=True)
    elif scheme in ("http", "https"):
        _check_server(uri)


def _known_scheme(uri: str) -> str:
    """The URI's scheme (a driver suffix dropped), or StoreError when MLflow has no store for it."""
    scheme = urlsplit(uri).scheme.split("+", 1)[0]  # postgresql+psycopg2: a driver suffix
    if scheme not in MLFLOW_SCHEMES and scheme not in _plugin_schemes() and uri != "databricks":
        raise StoreError(f"tracking URI {uri}: MLflow has no store for scheme '{scheme}'; use "
                         "sqlite:///<path>/mlflow.db, http(s)://<host>:<port> of an `mlflow "
                         "server`, or a database URL (postgresql://, mysql://)")
    return scheme


def check_readable(uri: str) -> None:
    """The checks of `open_client` for a reader (`hacrl ui`, reports): a scheme MLflow knows, a
    sqlite store that exists and is a database (a mistyped output root is not a new empty
    store), a server that answers. StoreError in one line otherwise."""
    scheme = _known_scheme(uri)
    db = sqlite_path(uri)
    if db is not None:
        _check_sqlite(db, create=False)
    elif scheme in ("http", "https"):
        _check_server(uri)


# the schemes MLflow 3 registers itself (mlflow/tracking/_tracking_service/utils.py)
MLFLOW_SCHEMES = {"", "file", "databricks", "databricks-uc", "uc", "http", "https", "postgresql",
                  "mysql", "sqlite", "mssql"}


def _plugin_schemes() -> set[str]:
    """Schemes other packages add through MLflow's `mlflow.tracking_store` entry points."""
    from importlib.metadata import entry_points

    return {ep.name for ep in entry_points(group="mlflow.tracking_store")}


@contextlib.contextmanager
def open_client(uri: str, *, create: bool = True) -> Iterator[Any]:
    """An MlflowClient on `uri`, opened (tables created or migrated) under the store's lock,
    which is held until the block ends. `create=False` (readers) refuses a sqlite store that
    does not exist yet instead of creating one. Faults raise StoreError in one line."""
    db = sqlite_path(uri)
    if db is not None:
        _check_sqlite(db, create)
        _quiet_locked_logs()
    elif urlsplit(uri).scheme in ("http", "https"):
        _check_server(uri)
    with _store_lock(db, required=create):
        if db is not None:
            _ready(db, create)
        yield _client(uri, db)


CREATING = ".creating-"  # <db>.creating-<pid>: a store being created, renamed into place when done
SET_ASIDE = ".half-created-"  # <db>.half-created-<time>: a half-created store moved out of the way


def _ready(db: Path, create: bool) -> None:
    """Under the store's lock: a sqlite store is complete (every migration applied) before
    MLflow opens it. A writer creates a missing store atomically: tables made and migrated under
    a temporary name, then renamed into place, so a kill or a full disk at any moment leaves
    either no store or a whole one (left-over temporary files are removed: only the lock's
    holder creates). A store a killed job of an earlier version left half-migrated, holding no
    runs, is set aside (renamed, not deleted) and created again; a store with runs is never
    touched: a store whose schema is not MLflow's current one raises StoreError saying what to do."""
    if create:
        for stale in db.parent.glob(f"{db.name}{CREATING}*"):
            with contextlib.suppress(OSError):
                stale.unlink()
    if db.is_file() and db.stat().st_size > 0:
        version, runs = _schema(db, writable=create)
        head = _head_revision()
        if version == head:
            if create:
                rebase_artifacts(db)
            return
        found = f"schema {version}" if version else "no schema version"
        if runs or not create:
            held = f"it holds {runs} runs, so hacrl leaves it as it is" if runs else \
                "a training job or sweep on this output root creates it again"
            fix = f"back it up, then run `mlflow db upgrade {sqlite_uri(db)}`" if runs else \
                f"or {STORE_HELP}"
            raise StoreError(f"the MLflow store {db} is not complete ({found}; MLflow "
                             f"{_mlflow_version()} needs {head}): {held}; {fix}")
        aside = db.with_name(f"{db.name}{SET_ASIDE}{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(db, aside)
        print(f"hacrl: the MLflow store {db} was half-created ({found}, no runs: a job was killed "
              f"while creating it); moved it to {aside.name} and creating it again",
              file=sys.stderr)
    if create and (not db.is_file() or db.stat().st_size == 0):
        _create(db)


def rebase_artifacts(db: Path) -> int:
    """A store in a moved or copied output root: its experiments' and runs' artifact locations
    still name the `mlartifacts/` folder beside the database where it was made (MLflow keeps
    absolute URIs). Re-base every such location onto the folder beside `db` now, so that this
    store's readers read its own artifacts and its writers never write into the old root.
    Locations elsewhere (a server's, the Default experiment's ./mlruns) are left as they are.
    Returns the number of experiments re-based. Runs under the store's lock (writers)."""
    import sqlite3

    here = artifacts_beside(db).resolve().as_uri()
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=rw", uri=True, timeout=30)
        try:
            old_roots = {location.rsplit(ARTIFACTS_DIR, 1)[0] + ARTIFACTS_DIR
                         for (location,) in con.execute("SELECT artifact_location FROM experiments")
                         if isinstance(location, str) and location.startswith("file://")
                         and ARTIFACTS_DIR + "/" in location + "/"}
            moved = sorted(old for old in old_roots if old != here)
            for old in moved:
                with con:
                    for table, column in (("experiments", "artifact_location"),
                                          ("runs", "artifact_uri")):
                        con.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                                    f"WHERE substr({column}, 1, ?) = ?",
                                    (here, len(old) + 1, len(old), old))
        finally:
            con.close()
    except sqlite3.Error as err:
        raise StoreError(f"cannot re-base the artifact folders of the MLflow store {db} "
                         f"({err}); {STORE_HELP}") from None
    return len(moved)


def _schema(db: Path, writable: bool) -> tuple[str | None, int]:
    """(alembic version, number of runs) of a sqlite store; None when it has no version yet.
    A writer opens it read-write, so that SQLite rolls back a transaction a kill left open."""
    import sqlite3

    try:
        mode = "rw" if writable else "ro"
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode={mode}", uri=True, timeout=30)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            row = (con.execute("SELECT version_num FROM alembic_version").fetchone()
                   if "alembic_version" in tables else None)
            runs = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] if "runs" in tables else 0
        finally:
            con.close()
    except sqlite3.Error as err:
        raise StoreError(f"cannot read the MLflow store {db} ({err}); move it away or "
                         f"{STORE_HELP}") from None
    return (str(row[0]) if row and row[0] else None), int(runs)


def _head_revision() -> str:
    from mlflow.store.db.utils import _get_latest_schema_revision

    return str(_get_latest_schema_revision())


def _mlflow_version() -> str:
    import mlflow

    return str(mlflow.__version__)


def _create(db: Path) -> None:
    """Create and migrate a store at `<db>.creating-<pid>`, then rename it to `db`."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    temporary = db.with_name(f"{db.name}{CREATING}{os.getpid()}")
    uri = sqlite_uri(temporary)
    stray = _stray_folders(uri, temporary)
    quiet = logging.getLogger("mlflow.store.db.utils")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # "Creating initial MLflow database tables...": noise
    try:
        store = SqlAlchemyStore(uri, DEFAULT_ARTIFACTS)
        store.engine.dispose()  # no connection to the file survives its rename
        SqlAlchemyStore._engine_map.pop(uri, None)
        with temporary.open("rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, db)
    except Exception as err:  # a full disk, a vanished folder: no store, nothing half-made
        for left in db.parent.glob(f"{temporary.name}*"):
            with contextlib.suppress(OSError):
                left.unlink()
        raise StoreError(f"cannot create the MLflow store {db} ({one_line(err)}); nothing was "
                         f"written: free space in (or fix) {db.parent} and run again, or "
                         f"{STORE_HELP}") from None
    finally:
        quiet.setLevel(level)
        for folder in stray:
            with contextlib.suppress(OSError):
                folder.rmdir()


def _check_sqlite(db: Path, create: bool) -> None:
    if create:
        _check_writable(db)
    elif not db.is_file() or db.stat().st_size == 0:
        raise StoreError(f"no MLflow store at {db}; run `hacrl sweep <name>` (or a training "
                         f"job) first, or {STORE_HELP} where the runs are")
    if db.is_file() and db.stat().st_size > 0:
        _check_header(db)


def _check_writable(db: Path) -> None:
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StoreError(f"cannot create the folder of the MLflow store {db.parent} "
                         f"({err.strerror or err}); make it writable or {STORE_HELP}") from None
    try:
        # sqlite writes its journal next to the db, so the folder must take new files; only
        # trying tells (read-only mounts, ACLs, root-squashed NFS fool os.access)
        fd, probe = tempfile.mkstemp(prefix=".hacrl-probe-", dir=db.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise StoreError(f"the folder of the MLflow store {db.parent} is not writable "
                         f"({err.strerror or err}); make it writable or {STORE_HELP}") from None
    if db.exists() and not db.is_file():
        raise StoreError(f"the MLflow store {db} is not a file; move it away or {STORE_HELP}")
    if db.exists() and not os.access(db, os.R_OK | os.W_OK):
        raise StoreError(f"the MLflow store {db} is read-only; make it writable (chmod u+w) "
                         f"or {STORE_HELP}")


def _check_header(db: Path) -> None:
    # MLflow retries a file it cannot open as a database for ~100 s before it fails
    try:
        with db.open("rb") as handle:
            header = handle.read(16)
    except OSError as err:
        raise StoreError(f"cannot read the MLflow store {db} ({err.strerror or err}); "
                         f"make it readable or {STORE_HELP}") from None
    if header != b"SQLite format 3\x00":
        raise StoreError(f"{db} is not a SQLite database; move it away or {STORE_HELP}")


def _check_server(uri: str) -> None:
    """Bound MLflow's HTTP retries, then ask the server once, briefly, whether it is there."""
    for name, value in HTTP_BOUNDS.items():
        os.environ.setdefault(name, value)
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S):
            return
    except urllib.error.HTTPError:
        return  # it answered (401 behind auth, a proxy's 404): MLflow's calls say what it means
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        if "CERTIFICATE" in str(reason).upper():
            return  # TLS settings are MLflow's (MLFLOW_TRACKING_SERVER_CERT_PATH, ...)
        raise StoreError(f"MLflow tracking server {uri} is unreachable ({reason}; no answer "
                         f"from {url} within {PROBE_TIMEOUT_S:.0f} s); start it, or point "
                         "tracking.uri= (or MLFLOW_TRACKING_URI) at a running one") from None


@contextlib.contextmanager
def _store_lock(db: Path | None, required: bool) -> Iterator[None]:
    """An exclusive flock on `<db>.lock` for the block; none for a server, nor for a reader
    that finds no lock file it can open (see `_open_lock`)."""
    fd = _open_lock(db, required) if db is not None else None
    try:
        if fd is not None:
            _acquire(fd, Path(f"{db}.lock"))
        yield
    finally:
        if fd is not None:
            os.close(fd)  # closing the file releases the lock (so does the process dying)


def _open_lock(db: Path, required: bool) -> int | None:
    """The lock file, created by writers. A reader never creates it: a writer makes it before
    the db, so a db without one was not made under the lock and nobody is making it now."""
    try:
        return os.open(f"{db}.lock", os.O_RDWR | (os.O_CREAT if required else 0), 0o666)
    except OSError as err:
        if not required:
            return None  # absent, or a read-only folder: nobody can be creating a store there
        raise StoreError(f"cannot create the lock file {db}.lock ({err.strerror or err}); "
                         f"make {db.parent} writable or {STORE_HELP}") from None


def _acquire(fd: int, lock: Path) -> None:
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise StoreError(f"waited {LOCK_WAIT_S:.0f} s for {lock}: another process is "
                                 "stuck opening this MLflow store; stop it and retry") from None
            time.sleep(0.05)


def _client(uri: str, db: Path | None) -> Any:
    # imported here, not at module import: a job pays for MLflow only once it tracks
    from mlflow.tracking import MlflowClient
    from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException

    stray = _stray_folders(uri, db)
    try:
        return MlflowClient(tracking_uri=uri)
    except UnsupportedModelRegistryStoreURIException:
        raise StoreError(f"tracking URI {uri}: MLflow has no store for scheme "
                         f"'{urlsplit(uri).scheme}'; use sqlite:///<path>/mlflow.db, "
                         "http(s)://<host>:<port> of an `mlflow server`, or a database URL "
                         "(postgresql://, mysql://)") from None
    except Exception as err:  # anything MLflow raises while opening is a store fault
        raise StoreError(f"cannot open the MLflow store {uri}: {one_line(err)}") from None
    finally:
        for folder in stray:
            with contextlib.suppress(OSError):
                folder.rmdir()


def _stray_folders(uri: str, db: Path | None) -> list[Path]:
    """Folders MLflow is about to create from the still-encoded URI text (its
    `_make_parent_dirs_if_sqlite`), deepest first; they are removed once it has opened."""
    if db is None:
        return []
    folder = Path(uri.removeprefix(SQLITE_PREFIX)).parent
    made: list[Path] = []
    while folder != db.parent and not folder.exists() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    return made


class _DropLocked(logging.Filter):
    """MLflow logs a traceback for every sqlite error ("database is locked", "attempt to write
    a readonly database", a full disk) before it raises it; Tracker retries the locked ones and
    turns the rest into one StoreError line (`unwritable`), so the tracebacks are noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "database is locked" not in message and \
            not message.startswith("SQLAlchemy database error")


def _quiet_locked_logs() -> None:
    logger = logging.getLogger("mlflow.store.db.utils")
    if not any(isinstance(f, _DropLocked) for f in logger.filters):
        logger.addFilter(_DropLocked())


def experiment_id(client: Any, name: str, artifacts: str | None, uri: str) -> str:
    """Get or create experiment `name`; a create that loses a race re-reads it by name."""
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return str(client.create_experiment(name, artifacts))
        except Exception:
            # another process created it between our read and our create (a server has no
            # file lock; nor do hosts whose shared filesystem ignores flock)
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    if found.lifecycle_stage == "deleted":
        raise StoreError(f"experiment {name!r} in {uri} is deleted; restore it (`mlflow "
                         f"experiments restore --experiment-id {found.experiment_id}`) or set "
                         "tracking.experiment=<another name>")
    return str(found.experiment_id)


def server_gone(err: BaseException) -> str | None:
    """Why a call to an `mlflow server` failed for good when the server was gone (refused or
    reset connections, an answer cut off mid-body, timeouts, 5xx answers through all of
    MLflow's retries): a short reason; None for any other error (a bad request, a deleted run:
    MLflow's own message says it)."""
    import requests

    cause = err.__cause__ or err.__context__
    text = str(err)
    # a server killed while it sends an answer leaves a chunked body cut short: requests says
    # ChunkedEncodingError, which is not a ConnectionError
    lost = requests.ConnectionError | requests.Timeout | requests.exceptions.ChunkedEncodingError
    if not (isinstance(cause, lost)
            or "Max retries exceeded" in text or "failed with timeout exception" in text):
        return None
    for reason in ("Connection refused", "Connection reset", "Remote end closed",
                   "Connection broken", "Read timed out", "timeout", "too many 5"):
        if reason.lower() in text.lower():
            return reason if reason != "too many 5" else "5xx answers"
    return "no answer"


# sqlite's answers for a store that can no longer be written (deleted or moved while open, a
# full disk, an I/O error, tables gone): a fault of the store, not of the job
UNWRITABLE = ("attempt to write a readonly database", "database or disk is full",
              "disk I/O error", "unable to open database file", "no such table",
              "database disk image is malformed", "file is not a database")


def unwritable(err: BaseException) -> str | None:
    """Which of `UNWRITABLE` an error (or its cause) says; None for any other error."""
    seen: BaseException | None = err
    while seen is not None:
        text = str(seen)
        for reason in UNWRITABLE:
            if reason in text:
                return reason
        seen = seen.__cause__ or seen.__context__
    return None


class Timed:
    """An MlflowClient whose calls add their wall time to `busy_s` (tracking overhead) and, on
    sqlite, are retried when the database is locked (`retries` times; counted in
    `locked_retries`)."""

    def __init__(self, client: Any, uri: str, retries: int) -> None:
        self._client = client
        self._uri = uri
        self._retries = retries
        self.busy_s = 0.0
        self.locked_retries = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            tic = time.perf_counter()
            try:
                return self._retry_locked(lambda: attr(*args, **kwargs))
            except Exception as err:
                if (reason := unwritable(err)) is not None:
                    raise StoreError(self._unwritable(reason)) from None
                if (reason := server_gone(err)) is None:
                    raise
                raise StoreError(
                    f"MLflow tracking server {self._uri} stopped answering ({reason}) and "
                    f"MLflow's retries are spent; once it runs again, rerun the same "
                    f"command: the job resumes from its newest checkpoint") from None
            finally:
                self.busy_s += time.perf_counter() - tic

        return timed

    def _unwritable(self, reason: str) -> str:
        db = sqlite_path(self._uri)
        where = str(db) if db is not None else self._uri
        gone = " (the file is gone: deleted or moved while the job ran)" if db is not None \
            and not db.exists() else ""
        return (f"the MLflow store {where} cannot be written: {reason}{gone}; restore it (or "
                "free space on its disk), then rerun the same command: the job resumes from "
                "its newest checkpoint")

    def _retry_locked(self, call: Callable[[], Any]) -> Any:
        """`call()`, retried when sqlite says "database is locked" (the failed transaction was
        rolled back, so a retry writes once); StoreError once the retries are spent."""
        for attempt in range(self._retries + 1):
            try:
                return call()
            except Exception as err:
                if "database is locked" not in str(err):
                    raise
                if attempt == self._retries:
                    raise StoreError(
                        f"the MLflow store {self._uri} stayed locked through "
                        f"{self._retries + 1} tries; another process holds a long write: "
                        "retry, or log many jobs to an `mlflow server`") from None
                self.locked_retries += 1
                time.sleep(0.1 * 2**attempt * random.uniform(0.5, 1.5))
        raise AssertionError("unreachable")
