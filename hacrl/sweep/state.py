"""Where a sweep keeps its state, and whether a cell is done.

<output_root>/sweeps/<name>/            (hydra.sweep.dir)
    manifest.json                       the distinct cells, written before any job starts
                                        (its format: hacrl/schema/sweep_manifest.py)
    cells/<cell id>.json                written by the job: running / done / failed, pid, log,
                                        and a heartbeat every HEARTBEAT_S while it runs
    status.json                         the final table of the last `hacrl sweep`
    .submitit/<job id>/                 submitit's own files and logs (local and SLURM)

"Done" is decided from the artifacts themselves, never from the sweep's memory: a training
cell is done when its run directory has DONE.json and its agent runs hold every protocol it
needs (same key); a base cell when each agent's evaluation run holds them.

"Running" is decided by something that expires: on this host the cell's process (pid and its
start token, so a reused pid does not count), elsewhere its heartbeat, which a lost node, an OOM
kill or a time limit stops; after DEADLINE_S without one the cell counts as killed and the next
`hacrl sweep` runs it again. Its job then takes the job's lock (`hacrl.job.job_lock`): if the
old process is only suspended it still holds the lock and the new one refuses, so a wrong
verdict never makes two trainers; otherwise the new job marks the old runs KILLED.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hacrl.checkpoint import read_done
from hacrl.core.layout import Layout, RunDir, SweepDir
from hacrl.schema import tags as T
from hacrl.schema.sweep_manifest import SweepManifest, read_manifest
from hacrl.sweep.grid import Cell
from hacrl.tracking import Tracker, process_alive
from hacrl.tracking.mlflow_store import sqlite_uri

HEARTBEAT_S = 30.0   # a running cell rewrites its state file this often
DEADLINE_S = 300.0   # ... and counts as dead on another host after this long without it
SQUEUE_TIMEOUT_S = 10.0  # a controller that does not answer: "cannot tell", not a hung status


def cell_state_path(sweep_dir: Path, cell_id: str) -> Path:
    return SweepDir(sweep_dir).cell_state(cell_id)


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; {} when there is none, and a warning when the file is there
    but is not an object (a damaged or foreign state file counts as no state)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        print(f"hacrl: warning: {path} is not a hacrl state file (damaged?); ignored",
              file=sys.stderr, flush=True)
        return {}
    return data


def alive(state: dict[str, Any]) -> bool:
    """Whether the process a "running" state names still runs (see the module docstring)."""
    if state.get("host") == socket.gethostname():
        try:
            pid = int(state.get("pid") or 0)
        except (TypeError, ValueError):
            return False
        token = state.get("pid_token")
        return process_alive(pid, token if isinstance(token, str) else None)
    beat = state.get("heartbeat", state.get("started"))
    return isinstance(beat, int | float) and time.time() - beat < DEADLINE_S


def slurm_queued(job: str) -> bool | None:
    """Whether SLURM still holds job `job` (pending, running, requeued); None when squeue
    cannot tell (not installed, no answer): the caller then trusts the state file."""
    if not job:
        return False
    try:
        answer = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                                text=True, timeout=SQUEUE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    if answer.returncode != 0:
        # an id the controller no longer knows is an error; anything else: cannot tell
        return False if "Invalid job id" in answer.stderr else None
    states = set(answer.stdout.split())
    return bool(states - {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
                          "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"})


def read_cells(sweep_dir: Path) -> tuple[SweepManifest | None, list[Cell]]:
    """The sweep folder's manifest (None: the sweep never started there) and its cells."""
    manifest = read_rebased_manifest(sweep_dir)
    return manifest, [Cell.of(c) for c in manifest.cells] if manifest else []


def read_rebased_manifest(sweep_dir: Path) -> SweepManifest | None:
    """The manifest of `sweep_dir` (`<root>/sweeps/<name>`) with the paths it recorded under the
    output root it was written in (the cells' run folders, the default store) re-based onto the
    root it is in now: a moved or copied output root is read in place, and its store is never
    looked for (or created) at the old path."""
    manifest = read_manifest(sweep_dir)
    if manifest is None:
        return None
    root = Path(sweep_dir).resolve().parent.parent
    written = {Path(c.run_dir).parent.parent for c in manifest.cells
               if c.run_dir and Path(c.run_dir).parent.name == "runs"}
    if len(written) != 1 or (old := written.pop()) == root:
        return manifest
    for cell in manifest.cells:
        if cell.run_dir and Path(cell.run_dir).is_relative_to(old):
            cell.run_dir = str(root / Path(cell.run_dir).relative_to(old))
    if manifest.tracking_uri == sqlite_uri(Layout(old).store_db):
        manifest.tracking_uri = sqlite_uri(Layout(root).store_db)
    return manifest


def _evaluated(tracker: Tracker, run_id: str, cell: Cell) -> bool:
    """The run holds each of the cell's protocols with its key, on the cell's benchmarks."""
    tags = tracker.client.get_run(run_id).data.tags
    for p in cell.protocols:
        if tags.get(T.eval_tag(p, "key")) != cell.protocol_keys.get(p):
            return False
        try:
            logged = json.loads(tags.get(T.eval_tag(p, "benchmarks"), "[]"))
        except ValueError:
            return False  # a damaged tag: evaluate again rather than stop the sweep
        if not isinstance(logged, list) or not set(cell.benchmarks) <= set(logged):
            return False  # e.g. only MATH-500 logged, for a sweep that reads them all
    return True


def artifacts_status(cell: Cell, tracker: Tracker) -> tuple[str, str]:
    """("done" | "trained" | "absent", MLflow run id(s)) from run directory and store alone."""
    if not cell.trains:
        if not cell.model_paths:  # a damaged or partial manifest: nothing to find, not "done"
            return "absent", ""
        ids = []
        for path in cell.model_paths.values():
            runs = tracker.model_evaluations(path, cell.scale, str(cell.zoo_seed))
            if not runs or not _evaluated(tracker, runs[0].info.run_id, cell):
                return "absent", ""
            ids.append(runs[0].info.run_id)
        return "done", ",".join(ids)
    teams = RunDir(Path(cell.run_dir)).teams()
    if not teams or not all(read_done(t.done) is not None for t in teams):
        return "absent", ""
    runs = tracker.find_runs(T.where({T.CONFIG_HASH: cell.id, T.KIND: T.JOB}, "FINISHED"))
    if not runs:
        return "trained", ""
    job = runs[0].info.run_id
    if cell.cost:
        return "done", job
    # each agent needs an evaluated run of its own: two runs of one agent do not stand in for
    # another, and a leftover run of an attempt that died before evaluating does not block
    evaluated = {ch.data.tags.get(T.MODEL) for ch in tracker.find_runs(T.where({T.PARENT: job}))
                 if _evaluated(tracker, ch.info.run_id, cell)}
    return ("done" if set(cell.agents) <= evaluated else "trained"), job


def cell_status(cell: Cell, sweep_dir: Path, tracker: Tracker) -> dict[str, Any]:
    """The cell's row: status done / running / failed / killed / pending, run id, log path."""
    state = read_json(cell_state_path(sweep_dir, cell.id))
    found, run_id = artifacts_status(cell, tracker)
    row = {"cell": cell.id, "what": cell.label, "sweeps": ",".join(cell.sweeps),
           "run": run_id or state.get("run", ""), "log": state.get("log", ""),
           "seconds": state.get("seconds"), "ended": state.get("ended")}
    if found == "done":
        return {**row, "status": "done"}
    status = state.get("status", "pending")
    if status == "running":
        status = "running" if alive(state) else "killed"
    elif status == "requeued":  # stopped for SLURM to requeue it: running while it is queued
        status = "killed" if slurm_queued(str(state.get("slurm_job", ""))) is False else "running"
        state = {**state, "phase": "requeued"}
    elif status == "done":
        status = "incomplete"  # the job ended but its results are not all there (e.g. removed)
    if status == "running":  # what it does now (hacrl.sweep.progress reads the same fields)
        row.update({k: state[k] for k in ("phase", "step", "steps", "started") if k in state})
    return {**row, "status": status, "error": state.get("error", "")}


def phase_text(state: dict[str, Any]) -> str:
    """What a running cell does now, from its state file: `training step 12/20`, ..."""
    phase = state.get("phase")
    if phase == "requeued":  # waits in SLURM's queue to resume after its last step
        return f"requeued after step {state['step']}" if state.get("step") else "requeued"
    if phase == "training" and state.get("steps"):
        return f"training step {state.get('step', 0)}/{state['steps']}"
    return str(phase) if phase else "starting"


def progress_text(row: dict[str, Any]) -> str:
    """`training step 12/20, 0:31` for a running cell, `35 s` for a finished one."""
    if row.get("status") == "running":
        from hacrl.core.eta import duration

        started = row.get("started")
        ran = f", {duration(time.time() - started)}" if isinstance(started, int | float) else ""
        return phase_text(row) + ran
    seconds = row.get("seconds")
    return f"{seconds:.0f} s" if isinstance(seconds, int | float) else ""


def format_table(rows: list[dict[str, Any]]) -> str:
    cols = [("status", 10), ("cell", 12), ("what", 44), ("progress", 26), ("run", 32),
            ("log", 0)]
    lines = ["  ".join(f"{name:<{width}}" if width else name for name, width in cols)]
    for row in rows:
        what = str(row.get("what", ""))
        what = what if len(what) <= 44 else what[:41] + "..."
        values = [str(row.get("status", "")), str(row.get("cell", "")), what,
                  progress_text(row), str(row.get("run", ""))[:32], str(row.get("log", ""))]
        lines.append("  ".join(f"{v:<{w}}" if w else v for v, (_, w) in zip(values, cols,
                                                                             strict=True)))
        if row.get("error") and row.get("status") in ("failed", "killed"):
            lines.append(f"{'':<12}error: {row['error']}")
    return "\n".join(lines)
