"""MLflow tracking: one run per job, one nested child run per agent, real stores only.

Runs carry the pid and host of their process (and a token of the process's start, against
reused pids) so a run whose process died can be marked KILLED. Tag names are
`hacrl.schema.tags`; how the store is opened, checked and locked is `hacrl.tracking.mlflow_store`.
"""

from __future__ import annotations

import functools
import getpass
import json
import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hacrl.core.errors import StoreError, one_line
from hacrl.core.layout import artifacts_beside
from hacrl.schema import tags as T
from hacrl.tracking.mlflow_store import (
    LOCKED_RETRIES,
    Timed,
    experiment_id,
    open_client,
    sqlite_path,
)

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
PARAM_VALUE_LIMIT = 6000  # MLflow's limit on a param value


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = str(value)[:PARAM_VALUE_LIMIT]
    return out


def clean_metric_name(name: str) -> str:
    """MLflow rejects '@' and '%' in metric names."""
    return name.replace("@", "_at_").replace("%", "pct")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_token(pid: int) -> str | None:
    """Who process `pid` is: the boot and its start time in clock ticks since boot (Linux,
    immune to wall-clock steps), else psutil's start time; None if there is no such process.
    A pid reused by another process has another token."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = stat.rsplit(")", 1)[1].split()[19]  # field 22, after the command name
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{ticks}"
    except (OSError, IndexError):
        pass
    import psutil

    try:
        return f"t:{psutil.Process(pid).create_time():.1f}"
    except (psutil.Error, ValueError):
        return None


def process_alive(pid: int, token: str | None = None) -> bool:
    """Whether process `pid` runs and, when its `token` is known, is the same process."""
    if pid <= 0 or not _pid_alive(pid):
        return False
    return token is None or process_token(pid) in (token, None)


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the checkout hacrl runs from ("unknown" outside a git checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def standard_tags(source: str) -> dict[str, str]:
    """MLflow's own source tags (its UI shows them as the run's source, user and commit)."""
    tags = {T.SOURCE_NAME: source, T.SOURCE_TYPE: "LOCAL", T.USER: _user()}
    if (commit := git_commit()) != "unknown":
        tags[T.SOURCE_COMMIT] = commit
    return tags


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return "unknown"


# --- opening a store: checks up front, one lock, one-line errors ---------------------------


class Tracker:
    """Runs, metrics, tags and artifacts in one MLflow store.

    Writes are synchronous: a metric is in the store when the call returns, so a job killed
    right after a checkpoint has its curves up to that checkpoint (resume relies on it).
    `busy_s` is the time the job spent in tracking, importing MLflow included. Opening the
    store creates it if needed (under its lock) and raises StoreError, in one line, when it
    cannot be opened or written.
    """

    def __init__(self, uri: str, experiment: str) -> None:
        tic = time.perf_counter()
        db = sqlite_path(uri)
        # next to the store, not MLflow's default ./mlruns in whatever the cwd is
        artifacts = artifacts_beside(db).resolve().as_uri() if db is not None else None
        self.uri = uri
        with open_client(uri) as client:
            self.client: Any = Timed(client, uri, LOCKED_RETRIES if db is not None else 0)
            try:
                self.experiment_id = experiment_id(self.client, experiment, artifacts, uri)
            except StoreError:
                raise
            except Exception as err:  # the store answered, but not usably
                raise StoreError(f"cannot read or create experiment {experiment!r} in {uri}: "
                                 f"{one_line(err)}") from None
        self.client.busy_s = time.perf_counter() - tic  # opening the store counts too

    @property
    def busy_s(self) -> float:
        """Seconds spent in MLflow calls so far (the harness's tracking overhead)."""
        return float(self.client.busy_s)

    def start_run(self, name: str, tags: Mapping[str, str], params: Mapping[str, str] | None = None,
                  parent_run_id: str | None = None) -> str:
        all_tags = {T.PID: str(os.getpid()), T.HOST: socket.gethostname(),
                    T.PID_TOKEN: process_token(os.getpid()) or "", **tags}
        if parent_run_id:
            all_tags[T.PARENT] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        if params:
            from mlflow.entities import Param

            items = [Param(k, v) for k, v in params.items()]
            for start in range(0, len(items), 100):
                self.client.log_batch(run.info.run_id, params=items[start:start + 100])
        return run.info.run_id

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int) -> None:
        self.log_steps(run_id, [(step, metrics, int(time.time() * 1000))])

    def log_steps(self, run_id: str, steps: Sequence[tuple[int, Mapping[str, float], int]]) -> None:
        """Several steps' metrics, (step, metrics, when in ms since the epoch) each, in as few
        writes as MLflow allows (1000 values each)."""
        from mlflow.entities import Metric

        items = [Metric(clean_metric_name(k), float(v), when, step)
                 for step, metrics, when in steps for k, v in metrics.items()]
        for start in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[start:start + 1000])

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_datasets(self, run_id: str,
                     datasets: Sequence[tuple[str, str, str, int, str]]) -> None:
        """MLflow dataset inputs of a run, one per (context, name, source URI, rows, sha256):
        the UI's Datasets column. The digest holds the sha256's first 32 hex digits (MLflow
        keeps 36 characters); the profile the whole of it and the row count."""
        if not datasets:
            return
        from mlflow.entities import Dataset, DatasetInput, InputTag

        inputs = [DatasetInput(Dataset(name=name, digest=sha[:32], source_type="local",
                                       source=json.dumps({"uri": source}),
                                       profile=json.dumps({"num_rows": rows, "sha256": sha})),
                               tags=[InputTag("mlflow.data.context", context)])
                  for context, name, source, rows, sha in datasets]
        for attempt in range(3):
            try:
                self.client.log_inputs(run_id, datasets=inputs)
                return
            except Exception as err:
                # MLflow looks a dataset up, then inserts it: two jobs that start together can
                # both insert the same one, and one of them fails on the unique key; once the
                # other's row is in, the retry finds it and only links it to this run
                if "UNIQUE constraint failed: datasets" not in str(err) or attempt == 2:
                    raise

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def log_artifacts(self, run_id: str, folder: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(run_id, str(folder), artifact_path)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def reopen(self, run_id: str) -> None:
        """A finished run RUNNING again, owned by this process (the reaper's tags)."""
        self.client.update_run(run_id, status="RUNNING")
        self.set_tags(run_id, {T.PID: str(os.getpid()), T.HOST: socket.gethostname(),
                               T.PID_TOKEN: process_token(os.getpid()) or ""})

    def copy_history(self, source_run: str, target_run: str, up_to_step: int) -> None:
        """Carry a killed run's curves (steps <= up_to_step) into the run that resumes it."""
        keys = self.client.get_run(source_run).data.metrics.keys()
        items = [m for key in keys for m in self.client.get_metric_history(source_run, key)
                 if m.step <= up_to_step]
        for start in range(0, len(items), 1000):
            self.client.log_batch(target_run, metrics=items[start:start + 1000])

    def reap_dead_runs(self, config_hash: str | None = None) -> list[str]:
        """Mark RUNNING runs of this host whose process is gone (or whose pid now belongs to
        another process) as KILLED; return their ids."""
        host = socket.gethostname()
        query = T.where({T.HOST: host, **({T.CONFIG_HASH: config_hash} if config_hash else {})},
                        status="RUNNING")
        reaped = []
        for run in self.client.search_runs([self.experiment_id], query, max_results=10_000):
            pid = int(run.data.tags.get(T.PID, "0") or 0)
            token = run.data.tags.get(T.PID_TOKEN) or None  # older runs have none
            if pid and not process_alive(pid, token):
                self.client.set_terminated(run.info.run_id, status="KILLED")
                reaped.append(run.info.run_id)
        return reaped

    def reap_config_runs(self, config_hash: str) -> list[str]:
        """Mark every RUNNING run of a job config KILLED, on any host, except this process's own
        (for the holder of the job's lock, who knows that no other process trains it)."""
        reaped = []
        mine = (str(os.getpid()), socket.gethostname())
        query = T.where({T.CONFIG_HASH: config_hash}, status="RUNNING")
        for run in self.client.search_runs([self.experiment_id], query, max_results=10_000):
            if (run.data.tags.get(T.PID), run.data.tags.get(T.HOST)) != mine:
                self.client.set_terminated(run.info.run_id, status="KILLED")
                reaped.append(run.info.run_id)
        return reaped

    def copy_eval_tags(self, source_run: str, target_run: str) -> None:
        """Carry the evaluation records (`hacrl.eval.*` tags) that go with copied metrics."""
        tags = {k: v for k, v in self.client.get_run(source_run).data.tags.items()
                if T.is_eval_tag(k)}
        if tags:
            self.set_tags(target_run, tags)

    def find_runs(self, query: str) -> list[Any]:
        return list(self.client.search_runs([self.experiment_id], query, max_results=10_000,
                                            order_by=["attributes.start_time DESC"]))

    def model_evaluations(self, model_path: str, scale: str, draw: str) -> list[Any]:
        """The evaluation runs of the model at `model_path` (a base model's or a checkpoint's
        own, not a job's), newest first, at `scale` and of zoo draw `draw` (`T.zoo_draw`)."""
        runs = self.find_runs(T.where({T.KIND: T.EVAL, T.MODEL_PATH: model_path, T.SCALE: scale}))
        return [r for r in runs if T.zoo_draw(r.data.tags) == draw]
