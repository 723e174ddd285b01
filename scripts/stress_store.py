"""Many writers on a brand-new sqlite MLflow store, all starting at once: does every point land?

    python scripts/stress_store.py [--writers 8] [--points 100] [--batch 5] [--reps 5] [--root DIR]

Each repetition makes a fresh output root (no `mlflow.db` yet) and starts `--writers` processes
that import MLflow, wait at a barrier (a `go` file), then all at the same moment open the store
through `hacrl.tracking.Tracker` (creating it), create a run and log `--points` metric points,
`--batch` per call (one step, `--batch` keys). The store is then read back independently and every
point of every writer is checked. Prints one line per repetition: writers, points expected and
landed, seconds from the barrier to the last writer done, and errors; exits 1 if anything was
lost or any writer failed. To compare: `--journal wal` puts the brand-new file in WAL mode
first; `--no-lock` makes the writers skip hacrl's store lock (what every entry point did before).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

EXPERIMENT = "stress"
WRITER_TIMEOUT_S = 600.0


@dataclass
class Repetition:
    writers: int
    expected: int
    landed: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    retries: int = 0  # calls retried after "database is locked", all writers together

    @property
    def ok(self) -> bool:
        return self.landed == self.expected and not self.errors

    def line(self, rep: int) -> str:
        errors = "; ".join(self.errors) if self.errors else "none"
        return (f"rep {rep}: writers {self.writers}, points expected {self.expected}, landed "
                f"{self.landed}, {self.seconds:.1f} s, locked retries {self.retries}, "
                f"errors: {errors}")


def expected_points(writer: int, points: int, batch: int) -> dict[str, dict[int, float]]:
    """{key: {step: value}} that writer `writer` logs (values tell writers apart)."""
    out: dict[str, dict[int, float]] = {}
    for n in range(points):
        step, key = divmod(n, batch)
        out.setdefault(f"m{key}", {})[step] = writer * 1_000_000 + n + 0.5
    return out


def _worker(uri: str, writer: int, points: int, batch: int, folder: Path, lock: bool) -> int:
    """One writer process: import, say ready, wait for `go`, then open, log, finish."""
    from mlflow.tracking import MlflowClient  # noqa: F401  (imported before the barrier)

    from hacrl.core.errors import one_line
    from hacrl.tracking import Tracker, mlflow_store

    if not lock:
        mlflow_store._acquire = lambda fd, path: None  # type: ignore[assignment]

    (folder / f"ready-{writer}").touch()
    while not (folder / "go").exists():  # every writer leaves this loop within ~10 ms
        time.sleep(0.01)
    report: dict[str, object] = {"writer": writer}
    try:
        tracker = Tracker(uri, EXPERIMENT)
        run_id = tracker.start_run(f"writer-{writer}", {"stress.writer": str(writer)})
        report["run_id"] = run_id
        by_step: dict[int, dict[str, float]] = {}
        for key, steps in expected_points(writer, points, batch).items():
            for step, value in steps.items():
                by_step.setdefault(step, {})[key] = value
        for step in sorted(by_step):
            tracker.log_metrics(run_id, by_step[step], step)
        tracker.finish(run_id)
        report["locked_retries"] = tracker.client.locked_retries
    except Exception as err:  # reported, not raised: the parent counts every failure
        report["error"] = f"{type(err).__name__}: {one_line(err)}"
    report["done"] = time.time()
    (folder / f"report-{writer}.json").write_text(json.dumps(report))
    return 0 if "error" not in report else 1


def run_writers(root: Path, writers: int, points: int, batch: int, journal: str = "delete",
                lock: bool = True) -> tuple[str, list[dict[str, object]], float]:
    """Start `writers` writer processes on the brand-new store `<root>/mlflow.db` at once.
    Returns the store's URI, the writers' reports and the seconds from `go` to the last done."""
    from hacrl.tracking.mlflow_store import resolve_uri

    root.mkdir(parents=True, exist_ok=True)
    db = root / "mlflow.db"
    if db.exists():
        raise SystemExit(f"{db} exists: a repetition needs a brand-new store")
    if journal == "wal":
        with sqlite3.connect(db) as con:  # an empty database file in WAL mode, no tables
            con.execute("PRAGMA journal_mode=wal")
    uri = resolve_uri(None, root)
    folder = Path(tempfile.mkdtemp(prefix="barrier-", dir=root))
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(w), "--uri", uri,
                               "--points", str(points), "--batch", str(batch),
                               "--barrier", str(folder), *([] if lock else ["--no-lock"])],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
             for w in range(writers)]
    deadline = time.monotonic() + WRITER_TIMEOUT_S
    while len(list(folder.glob("ready-*"))) < writers:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            break
        time.sleep(0.05)
    go = time.time()
    (folder / "go").touch()
    stderr = [p.communicate(timeout=WRITER_TIMEOUT_S)[1] for p in procs]
    reports = []
    for w, (proc, err) in enumerate(zip(procs, stderr, strict=True)):
        path = folder / f"report-{w}.json"
        if path.exists():
            reports.append(json.loads(path.read_text()))
        else:
            tail = (err.strip().splitlines() or ["no output"])[-1]
            reports.append({"writer": w, "error": f"exit {proc.returncode}: {tail}"})
    done = max((float(r["done"]) for r in reports if "done" in r), default=go)  # type: ignore[arg-type]
    return uri, reports, done - go


def landed_points(uri: str) -> dict[int, dict[str, dict[int, float]]]:
    """{writer: {key: {step: value}}} as read back from the store (a fresh client)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    out: dict[int, dict[str, dict[int, float]]] = {}
    if experiment is None:
        return out
    for run in client.search_runs([experiment.experiment_id], max_results=10_000):
        writer = int(run.data.tags["stress.writer"])
        curves = out.setdefault(writer, {})
        for key in run.data.metrics:
            for m in client.get_metric_history(run.info.run_id, key):
                curves.setdefault(key, {})[m.step] = m.value
    return out


def repetition(root: Path, writers: int, points: int, batch: int, journal: str = "delete",
               lock: bool = True) -> Repetition:
    uri, reports, seconds = run_writers(root, writers, points, batch, journal, lock)
    result = Repetition(writers, writers * points, seconds=seconds)
    result.errors = [f"writer {r['writer']}: {r['error']}" for r in reports if "error" in r]
    result.retries = sum(int(str(r.get("locked_retries", 0))) for r in reports)
    got = landed_points(uri)
    for w in range(writers):
        for key, steps in expected_points(w, points, batch).items():
            have = got.get(w, {}).get(key, {})
            result.landed += sum(1 for s, v in steps.items() if have.get(s) == v)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--points", type=int, default=100, help="metric points per writer")
    parser.add_argument("--batch", type=int, default=5, help="points per logging call")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--journal", choices=("delete", "wal"), default="delete")
    parser.add_argument("--no-lock", dest="lock", action="store_false",
                        help="writers skip the store lock (shows what it prevents)")
    parser.add_argument("--root", type=Path, help="folder for the repetitions (default: a temp)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--uri", help=argparse.SUPPRESS)
    parser.add_argument("--barrier", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return _worker(args.uri, args.worker, args.points, args.batch, args.barrier, args.lock)
    base = args.root or Path(tempfile.mkdtemp(prefix="stress-store-"))
    failed: list[str] = []
    for rep in range(1, args.reps + 1):
        result = repetition(base / f"rep{rep}", args.writers, args.points, args.batch,
                            args.journal, args.lock)
        print(result.line(rep), flush=True)
        if not result.ok:
            failed.append(f"rep {rep}: {result.expected - result.landed} of {result.expected} "
                          f"points lost, {len(result.errors)} writer error(s)")
    if failed:
        print(f"stress_store: FAIL: {'; '.join(failed)} ({base})")
        return 1
    print(f"stress_store: ok: every point landed in all {args.reps} repetitions ({base})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
