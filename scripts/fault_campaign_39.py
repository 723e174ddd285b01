"""The cases of issue 39 for scripts/fault_campaign.py: values out of range, a new store killed
or starved while it is created, results that do not match the job, workers that outlive their
command, moved and copied output roots, evaluation-only jobs side by side, and faults that must
each be one `hacrl:` line. Each case runs the real command and records (case, expected,
observed) through the campaign."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (override, what it would do unchecked): each must be refused by `--dry-run` in one line
OUT_OF_RANGE = [
    ("train.grad_clip=-1", "flips every gradient"), ("train.grad_clip=0", "zeroes them"),
    ("rollout.temperature=-0.5", "inverted sampling"), ("rollout.top_p=1.5", "no nucleus"),
    ("train.lr=nan", "crash after runs exist"), ("train.lr=inf", "crash"),
    ("train.betas=[0.9,1.0]", "Adam refuses"), ("train.weight_decay=-0.1", "AdamW refuses"),
    ("train.save_every=0", "modulo by zero"), ("seed=1099511627776", "numpy seed refuses"),
    ("verify.timeout_s=0", "every grade times out"), ("verify.workers=0", "no grader"),
    ("engine.threads=-1", "torch refuses"), ("rollout.max_new_tokens=1000000000",
                                             "KV cache cannot be allocated"),
    ("eval.protocols.main.top_p=0", "nothing to sample"), ("algo.omega_clamp=[10,0.1]",
                                                          "empty clamp"),
]


def _lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.replace("\r", "\n").splitlines() if ln.startswith("hacrl:")]


def _runs(root: Path, query: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    ids = [e.experiment_id for e in client.search_experiments()]
    return list(client.search_runs(ids, query)) if ids else []


def ranges(c: Any) -> None:
    root = c.root("ranges")
    for override, unchecked in OUT_OF_RANGE:
        code, secs, line, err = c.run([*c.hacrl, "train", "--dry-run", override,
                                       f"output_root={root}"], root)
        key = override.split("=", 1)[0]
        c.record(f"{override} ({unchecked})", code == 2 and len(_lines(err)) == 1
                 and "Traceback" not in err and f"{key}=" in line and "must be" in line, code,
                 secs, line, not root.exists(), "exit 2, one line, nothing written")
    many = [OUT_OF_RANGE[i][0] for i in (0, 2, 3, 4)]  # four keys (0 and 1 share one)
    code, secs, line, err = c.run([*c.hacrl, "train", *many, f"output_root={root}"], root)
    c.record("four values out of range at once", code == 2 and len(_lines(err)) == 4, code, secs,
             f"{len(_lines(err))} lines; last: {line}", not root.exists(), "exit 2, four lines")


def _writer_until(c: Any, root: Path, seen: Callable[[], bool],
                  timeout: float = 120) -> subprocess.Popen[str]:
    job = subprocess.Popen([*c.hacrl, "train", *c.quick, f"output_root={root}"],
                           env=c.env(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           text=True)
    deadline = time.monotonic() + timeout
    while not seen() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return job


def _appears(folder: Path, pattern: str) -> Callable[[], bool]:
    return lambda: any(folder.glob(pattern))


def store_creation_kills(c: Any) -> None:
    """SIGKILL `hacrl train` at six moments of creating a brand-new store (1 s after start,
    before its temporary store appears; as it appears; 0.1, 0.3, 1 and 2 s later), then run the
    same command again: it must finish, on a whole store, with no temporary file left."""
    from hacrl.tracking.mlflow_store import CREATING

    for label, delay in (("before", -1.0), ("+0.0 s", 0.0), ("+0.1 s", 0.1), ("+0.3 s", 0.3),
                         ("+1.0 s", 1.0), ("+2.0 s", 2.0)):
        root = c.root(f"store-kill-{label.strip('+ ')}")
        root.mkdir()
        tic = time.perf_counter()
        if delay < 0:
            job = _writer_until(c, root, lambda: False, timeout=1.0)
        else:
            job = _writer_until(c, root, _appears(root, f"mlflow.db{CREATING}*"))
            time.sleep(delay)
        job.send_signal(signal.SIGKILL)
        job.wait()
        left = sorted(p.name for p in root.iterdir())
        code, secs, line, err = c.train(root)
        finished = len(_runs(root, "tags.`hacrl.kind` = 'job' and attributes.status = "
                                   "'FINISHED'"))
        clean = not any(CREATING in p.name for p in root.iterdir())
        c.record(f"new store killed {label} its temporary store appears", code == 0
                 and finished == 1 and clean, code, time.perf_counter() - tic,
                 f"left {left}; rerun: {finished} job FINISHED", True,
                 "rerun finishes on a whole store")


def small_disk(c: Any, size: str) -> Path | None:
    """A tmpfs of `size` (a real full disk); None where mounting is not allowed (not root)."""
    disk = c.work / f"disk-{size}"
    disk.mkdir(exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        print(f"     (no tmpfs of {size}: mounting needs root; full-disk case left out)")
        return None
    c.mounts.append(disk)
    return disk


def full_disks(c: Any) -> None:
    tiny = small_disk(c, "300k")  # not even the store fits
    if tiny is not None:
        root = tiny / "out"
        code, secs, line, err = c.train(root)
        c.record("disk full while the store is created", code == 1 and len(_lines(err)) == 1
                 and "Traceback" not in err, code, secs, line,
                 not (root / "mlflow.db").exists(), "one line, no store left")
        subprocess.run(["mount", "-o", "remount,size=64m", str(tiny)], check=True)
        code, secs, line, err = c.train(root)
        c.record("... with room again", code == 0, code, secs, line or "finished", True,
                 "the job runs")
    small = small_disk(c, "1800k")  # the store and one checkpoint, not two
    if small is not None:
        root = small / "out"
        code, secs, line, err = c.train(root, "train.steps=12", "train.save_every=1")
        c.record("disk full while checkpointing", code == 1 and len(_lines(err)) == 1
                 and "Traceback" not in err, code, secs, line, True, "one line, exit 1")
        subprocess.run(["mount", "-o", "remount,size=64m", str(small)], check=True)
        code, secs, line, err = c.train(root, "train.steps=12", "train.save_every=1")
        c.record("... with room again: resumes", code == 0, code, secs, line or "finished", True,
                 "resumes, finishes")


def forged_done(c: Any) -> None:
    root = c.root("forged-done")
    evaluated = ["eval.at_end=true", "eval.benchmarks=[tiny_gsm8k]"]
    c.train(root, *evaluated, HACRL_FAULT="done_json")
    done = next(root.glob("runs/*/team-0/DONE.json"))
    record = json.loads(done.read_text())
    record["final"] = {m: {k: 0.987654 for k in v} for m, v in record["final"].items()}
    record["final"]["intruder-model"] = {"eval/main/tiny_gsm8k/acc": 0.987654}
    done.write_text(json.dumps(record))
    code, secs, _, err = c.train(root, *evaluated)
    jobs = _runs(root, "tags.`hacrl.kind` = 'job' and attributes.status = 'FINISHED'")
    scores = [v for r in jobs for k, v in r.data.metrics.items() if k.startswith(("acc/", "avg/"))]
    warned = [ln for ln in err.splitlines() if "DONE.json is damaged or not this team's" in ln]
    c.record("DONE.json with made-up scores and a model", code == 0 and len(jobs) == 1
             and bool(scores) and 0.987654 not in scores and bool(warned), code, secs,
             (warned[0] if warned else "no warning")[-110:], True,
             "refused; scores from the runs")


def zoo_build_kill(c: Any) -> None:
    import psutil

    root = c.work / "zoo-kill"
    shutil.rmtree(root, ignore_errors=True)
    tic = time.perf_counter()
    build = subprocess.Popen([*c.hacrl, "zoo", "build", "--root", str(root), "--workers", "2",
                              "llama3.2-1b-instruct", "qwen3-1.7b-base"], env=c.env(root),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(build.pid)
    workers: list[Any] = []
    while len(workers) < 2 and build.poll() is None and time.perf_counter() - tic < 180:
        workers = [p for p in parent.children() if "spawn_main" in " ".join(p.cmdline())]
        time.sleep(0.2)
    time.sleep(3)
    build.send_signal(signal.SIGKILL)
    build.wait()
    _, alive = psutil.wait_procs(workers, timeout=15)
    time.sleep(5)
    models = [p.name for p in root.iterdir() if not p.name.startswith(".")] if root.exists() else []
    c.record("hacrl zoo build killed (2 workers)", len(workers) == 2 and not alive and not models,
             -9, time.perf_counter() - tic, f"{len(workers)} workers, {len(alive)} alive after "
             f"15 s; models written after: {models}", True, "workers end, nothing written")


def with_report(sweep: str) -> str:
    """The campaign's mini sweep with a table to report (Table 2's layout)."""
    return sweep.replace("    name: mini\n", "    name: mini\n    report:\n      tables: [table2]\n")


def moved_roots(c: Any) -> None:
    configs = c.work / "configs"
    (configs / "sweep").mkdir(parents=True, exist_ok=True)
    (configs / "sweep" / "mini.yaml").write_text(with_report(c.mini))
    first = c.root("root-a")
    c.run([*c.hacrl, "sweep", "mini", f"hydra.searchpath=[file://{configs}]",
           f"output_root={first}", *c.quick, "eval.at_end=true",
           "eval.benchmarks=[tiny_gsm8k]"], first)
    moved = c.root("root-moved")
    first.rename(moved)
    code, secs, line, err = c.run([*c.hacrl, "status", "mini", f"output_root={moved}"], moved)
    out = subprocess.run([*c.hacrl, "status", "mini", f"output_root={moved}"],
                         env=c.env(moved), capture_output=True, text=True).stdout
    c.record("status of a moved output root", code == 0 and "failed" not in out
             and not first.exists(), code, secs, out.strip().splitlines()[-1][:120],
             not first.exists(), "cells done; old path untouched")
    copy = c.root("root-copy")
    shutil.copytree(moved, copy)
    before = sorted((str(p), p.stat().st_mtime_ns) for p in moved.rglob("*"))
    c.run([*c.hacrl, "status", "mini", f"output_root={copy}"], copy)
    code, secs, line, err = c.run([*c.hacrl, "report", "mini", f"output_root={copy}",
                                   f"hydra.searchpath=[file://{configs}]"], copy)
    after = sorted((str(p), p.stat().st_mtime_ns) for p in moved.rglob("*"))
    from hacrl.core.layout import artifacts_beside

    db = copy / "mlflow.db"
    import sqlite3

    with sqlite3.connect(db) as con:
        foreign = [loc for (loc,) in con.execute("SELECT artifact_uri FROM runs")
                   if "mlartifacts" in loc
                   and artifacts_beside(db).resolve().as_uri() not in loc]
    c.record("report of a copied output root", code == 0 and not foreign and before == after,
             code, secs, f"{len(foreign)} runs point outside the copy; original untouched: "
             f"{before == after}", before == after, "reads and writes the copy only")


def eval_side_by_side(c: Any) -> None:
    root = c.root("eval-twice")
    args = [*c.hacrl, "eval", "--model", "qwen3-4b-base", f"output_root={root}",
            "eval.benchmarks=[tiny_gsm8k]", "eval.protocols.main.limit=30"]
    tic = time.perf_counter()
    jobs = [subprocess.Popen(args, env=c.env(root), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [job.communicate(timeout=600)[1] for job in jobs]
    from mlflow.tracking import MlflowClient

    runs = _runs(root, "tags.`hacrl.kind` = 'eval'")
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    twice = [k for r in runs for k in r.data.metrics
             if len(client.get_metric_history(r.info.run_id, k)) > 1]
    waited = any("waiting for the evaluation" in e for e in errs)
    c.record("two hacrl eval of one model at once", len(runs) == 1 and not twice
             and all(j.returncode == 0 for j in jobs), jobs[0].returncode,
             time.perf_counter() - tic, f"{len(runs)} run, {len(twice)} metrics logged twice; "
             f"second waited: {waited}", True, "one run, each metric once")


def _interrupted(c: Any, root: Path, extra: list[str], marker: bytes,
                 then: Callable[[], None] | None) -> tuple[subprocess.Popen[bytes], str]:
    """`hacrl train` whose stderr is read until `marker`; then `then()` (None: SIGTERM it).
    The ended job and all its stderr."""
    job = subprocess.Popen([*c.hacrl, "train", *c.quick, *extra, f"output_root={root}"],
                           env=c.env(root), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert job.stderr is not None
    seen = b""
    while marker not in seen:
        chunk = os.read(job.stderr.fileno(), 4096)
        if not chunk:
            break
        seen += chunk
    if then is None:
        job.send_signal(signal.SIGTERM)
    else:
        then()
    err = (seen + job.stderr.read()).decode(errors="replace")
    job.wait()
    return job, err


def one_line_faults(c: Any) -> None:
    # a store deleted while the job writes
    root = c.root("deleted-store")
    tic = time.perf_counter()
    job, err = _interrupted(c, root, ["train.steps=8"], b"step/s", (root / "mlflow.db").unlink)
    lines = _lines(err)
    c.record("store deleted mid-job", job.returncode == 1 and len(lines) == 1
             and "Traceback" not in err, job.returncode, time.perf_counter() - tic,
             lines[-1] if lines else err[-150:], True, "one line, exit 1")
    # SIGTERM while the job evaluates
    root = c.root("sigterm-eval")
    tic = time.perf_counter()
    job, err = _interrupted(c, root, ["eval.at_end=true"], b"generate_until", None)
    lines = _lines(err)
    c.record("SIGTERM during evaluation", job.returncode == 143 and len(lines) == 1
             and "Traceback" not in err, job.returncode, time.perf_counter() - tic,
             lines[-1] if lines else err[-150:], True, "one line, exit 143")
    # bad user sweep files
    configs = c.work / "bad-configs"
    (configs / "sweep").mkdir(parents=True, exist_ok=True)
    for name, text in (("yaml", "hydra:\n  sweeper:\n    grids: [\n"),
                       ("shape", "defaults:\n  - override /hydra/sweeper: hacrl\nhydra:\n"
                                 "  sweeper:\n    grids: 5\n")):
        (configs / "sweep" / f"{name}.yaml").write_text(text)
        root = c.root(f"bad-sweep-{name}")
        code, secs, line, err = c.run([*c.hacrl, "sweep", name,
                                       f"hydra.searchpath=[file://{configs}]",
                                       f"output_root={root}"], root)
        c.record(f"user sweep file: {name}", code == 2 and len(_lines(err)) == 1
                 and "Traceback" not in err, code, secs, line, not root.exists(),
                 "exit 2, one line")
    # hacrl ui: a mistyped output root, a bogus URI, a busy port
    import socket

    store = c.root("ui-store")
    from hacrl.tracking import Tracker

    Tracker(f"sqlite:///{store / 'mlflow.db'}", "hacrl-tiny")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for label, args in (("mistyped output root", [f"output_root={store}-typo"]),
                            ("bogus URI", ["--uri", "bogus://x"]),
                            ("busy port", [f"output_root={store}", "--port", str(port)])):
            code, secs, line, err = c.run([*c.hacrl, "ui", *args], store, timeout=60)
            c.record(f"hacrl ui: {label}", code == 1 and len(_lines(err)) == 1
                     and "Traceback" not in err, code, secs, line,
                     not Path(f"{store}-typo").exists(), "exit 1, one line, serves nothing")


def locks_and_the_rest(c: Any) -> None:
    root = c.root("escaped")
    code, secs, line, err = c.train(root, "tracking.experiment=\\${seed}x")
    from mlflow.tracking import MlflowClient

    names = [e.name for e in MlflowClient(f"sqlite:///{root / 'mlflow.db'}").search_experiments()]
    c.record("escaped \\${seed} in an override", code == 0 and "${seed}x" in names, code, secs,
             f"experiments: {names}", True, "stays literal")
    configs = c.work / "configs"
    (configs / "sweep").mkdir(parents=True, exist_ok=True)
    (configs / "sweep" / "mini.yaml").write_text(with_report(c.mini))
    root = c.root("user-report")
    c.run([*c.hacrl, "sweep", "mini", f"hydra.searchpath=[file://{configs}]",
           f"output_root={root}", *c.quick], root)
    shutil.rmtree(root / "reports", ignore_errors=True)  # the sweep's own report: made again
    code, secs, line, err = c.run([*c.hacrl, "report", "mini", f"output_root={root}",
                                   f"hydra.searchpath=[file://{configs}]", "--no-mlflow"], root)
    made = (root / "reports" / "mini-tiny" / "index.html").is_file()
    c.record("report of a user's own sweep", code == 0 and made, code, secs,
             f"report written: {made}", True, "found on its search path")


CASES = [ranges, store_creation_kills, full_disks, forged_done, zoo_build_kill, moved_roots,
         eval_side_by_side, one_line_faults, locks_and_the_rest]
