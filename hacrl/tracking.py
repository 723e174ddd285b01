"""MLflow tracking: one run per job, one nested child run per agent, real stores only.

The default store is `sqlite:///<output_root>/mlflow.db` (created before any job logs to it);
`MLFLOW_TRACKING_URI` or `tracking.uri` point elsewhere (e.g. an `mlflow server`).
Runs carry the pid and host of their process so a run whose process died can be marked KILLED.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

PARAM_VALUE_LIMIT = 6000


def resolve_uri(configured: str | None, output_root: Path) -> str:
    if configured:
        return configured
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{output_root / 'mlflow.db'}"


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


class _Timed:
    """An MlflowClient whose calls add their wall time to `busy_s` (tracking overhead)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.busy_s = 0.0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            tic = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.busy_s += time.perf_counter() - tic

        return timed


class Tracker:
    """Runs, metrics, tags and artifacts in one MLflow store.

    Writes are synchronous: a metric is in the store when the call returns, so a job killed
    right after a checkpoint has its curves up to that checkpoint (resume relies on it).
    `busy_s` is the time the job spent in tracking, importing MLflow included.
    """

    def __init__(self, uri: str, experiment: str) -> None:
        tic = time.perf_counter()
        # imported here, not at module import: a job pays for MLflow only once it tracks, and
        # that time is counted as tracking overhead
        from mlflow.tracking import MlflowClient

        artifacts = None
        if uri.startswith("sqlite:///"):
            db = Path(uri.removeprefix("sqlite:///"))
            db.parent.mkdir(parents=True, exist_ok=True)
            # next to the store, not MLflow's default ./mlruns in whatever the cwd is
            artifacts = (db.parent / "mlartifacts").resolve().as_uri()
        self.uri = uri
        self.client: Any = _Timed(MlflowClient(tracking_uri=uri))
        existing = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (existing.experiment_id if existing is not None
                              else self.client.create_experiment(experiment, artifacts))
        self.client.busy_s = time.perf_counter() - tic  # opening the store counts too

    @property
    def busy_s(self) -> float:
        """Seconds spent in MLflow calls so far (the harness's tracking overhead)."""
        return float(self.client.busy_s)

    def start_run(self, name: str, tags: Mapping[str, str], params: Mapping[str, str] | None = None,
                  parent_run_id: str | None = None) -> str:
        all_tags = {"hacrl.pid": str(os.getpid()), "hacrl.host": socket.gethostname(), **tags}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        if params:
            from mlflow.entities import Param

            items = [Param(k, v) for k, v in params.items()]
            for start in range(0, len(items), 100):
                self.client.log_batch(run.info.run_id, params=items[start:start + 100])
        return run.info.run_id

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(clean_metric_name(k), float(v), now, step) for k, v in metrics.items()]
        for start in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[start:start + 1000])

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def log_artifacts(self, run_id: str, folder: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(run_id, str(folder), artifact_path)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def copy_history(self, source_run: str, target_run: str, up_to_step: int) -> None:
        """Carry a killed run's curves (steps <= up_to_step) into the run that resumes it."""
        keys = self.client.get_run(source_run).data.metrics.keys()
        items = [m for key in keys for m in self.client.get_metric_history(source_run, key)
                 if m.step <= up_to_step]
        for start in range(0, len(items), 1000):
            self.client.log_batch(target_run, metrics=items[start:start + 1000])

    def reap_dead_runs(self, config_hash: str | None = None) -> list[str]:
        """Mark RUNNING runs of this host whose process is gone as KILLED; return their ids."""
        host = socket.gethostname()
        query = f"attributes.status = 'RUNNING' and tags.`hacrl.host` = '{host}'"
        if config_hash:
            query += f" and tags.config_hash = '{config_hash}'"
        reaped = []
        for run in self.client.search_runs([self.experiment_id], query, max_results=10_000):
            pid = int(run.data.tags.get("hacrl.pid", "0") or 0)
            if pid and pid != os.getpid() and not _pid_alive(pid):
                self.client.set_terminated(run.info.run_id, status="KILLED")
                reaped.append(run.info.run_id)
        return reaped

    def find_runs(self, query: str) -> list[Any]:
        return list(self.client.search_runs([self.experiment_id], query, max_results=10_000,
                                            order_by=["attributes.start_time DESC"]))
