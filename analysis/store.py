"""Runs of an MLflow store as a pandas table, metric histories (curves) and artifact files on
demand.

One row per run: its status, what it is (tags `hacrl.kind`, method, model, pair, seed, scale,
config_hash, ...), the metrics a report reads (final values of eval/, time/, memory/, ratio/) and a
few params. Any store MLflow opens works (sqlite file, `mlflow server`, ...).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import pandas as pd

from hacrl.schema import tags as T
from hacrl.schema.metric_names import REPORTED_PREFIXES

TAGS = (T.KIND, T.METHOD, T.MODEL, T.PAIR, T.SETTING, T.SEED, T.SCALE, T.CONFIG_HASH, T.CELL,
        T.MODEL_PATH, T.ZOO_SEED, T.PARENT, T.TIMING_REPEAT, T.RUN_NAME, T.GIT_COMMIT,
        T.SOURCE_COMMIT, T.SWEEPS, T.GPU_TYPE)
PARAMS = ("algo.alpha", "algo.cross_clip_lower", "algo.delta_step", "train.steps",
          "engine.threads", "pair.name", "train.lr", "train.prompts_per_step",
          "train.minibatch_prompts", "train.rollouts_per_prompt", "rollout.max_new_tokens",
          "algo.clip_low", "algo.clip_high", "algo.capability_window")
METRIC_PREFIXES = REPORTED_PREFIXES


@dataclass
class Store:
    """The runs of one experiment of one store; `history` reads curves and `artifact` fetches
    files lazily, each at most once per store."""

    uri: str
    experiment: str
    runs: pd.DataFrame
    client: Any = field(repr=False)
    _curves: dict[tuple[str, str], list[tuple[int, float]]] = field(default_factory=dict,
                                                                     repr=False)
    _files: dict[tuple[str, str], Path | None] = field(default_factory=dict, repr=False)
    # where downloaded artifacts lie; removed with the store (or at exit)
    _downloads: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """[(step, value)] of a metric, in step order (the last value per step)."""
        if (run_id, key) not in self._curves:
            points = {m.step: m.value for m in sorted(
                self.client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))}
            self._curves[(run_id, key)] = sorted(points.items())
        return self._curves[(run_id, key)]

    def artifact(self, run_id: str, path: str) -> Path | None:
        """A local path of a run's artifact file `path` (`eval/main/outcomes.parquet`), or None
        when the run has no such file: the file itself where the store keeps its artifacts on
        this file system, else a copy downloaded once. Each (run, path) is asked for once per
        store: a report reading the same runs for several tables fetches nothing twice. A
        forced re-evaluation replaces a run's artifacts: open the store again to see it."""
        key = (run_id, path)
        if key not in self._files:
            folder = self._local_artifacts(run_id)
            if folder is not None:  # a file:// artifact root: read in place, nothing to copy
                self._files[key] = file if (file := folder / path).is_file() else None
                return self._files[key]
            parent, _, _ = path.rpartition("/")
            # listing first tells "not there" apart from a failed download
            listed = {f.path for f in self.client.list_artifacts(run_id, parent or None)
                      if not f.is_dir}
            found = None
            if path in listed:
                if self._downloads is None:
                    self._downloads = tempfile.TemporaryDirectory(prefix="hacrl-artifacts-")
                dest = Path(self._downloads.name) / run_id
                dest.mkdir(parents=True, exist_ok=True)
                found = Path(self.client.download_artifacts(run_id, path, str(dest)))
            self._files[key] = found
        return self._files[key]

    def _local_artifacts(self, run_id: str) -> Path | None:
        """The run's artifact folder when it is on this file system (a `file://` or plain-path
        artifact root, as a sqlite store's is); None for a server's (`mlflow-artifacts:`,
        `s3://`, ...), which MLflow's client downloads. Listing and downloading through the
        client cost ~0.04 s a file, most of a report's time on a store of a paper sweep."""
        found = self.runs.loc[self.runs["run_id"] == run_id, "artifact_uri"]
        uri = str(found.iloc[0]) if len(found) and isinstance(found.iloc[0], str) else ""
        parsed = urlparse(uri)
        if not uri or parsed.scheme not in ("", "file") or parsed.netloc not in ("", "localhost"):
            return None
        folder = Path(url2pathname(parsed.path) if parsed.scheme else uri)  # %20 -> space
        return self._rebased(folder)

    def _rebased(self, folder: Path) -> Path:
        """A sqlite store's artifacts live beside its database (`mlartifacts/`); a store in a
        moved or copied output root still names the old root's folder (MLflow keeps absolute
        URIs; a writer re-bases them when it opens the store, `rebase_artifacts`): read this
        store's own copy, never the old root's."""
        from hacrl.core.layout import artifacts_beside
        from hacrl.tracking.mlflow_store import sqlite_path

        db = sqlite_path(self.uri)
        beside = artifacts_beside(db) if db is not None else None
        if beside is None or beside.name not in folder.parts:
            return folder
        parts = folder.parts
        last = len(parts) - 1 - parts[::-1].index(beside.name)
        return beside.joinpath(*parts[last + 1:])

    def select(self, **equal: Any) -> pd.DataFrame:
        """Rows whose columns equal the given values (tags compare as strings)."""
        df = self.runs
        for key, value in equal.items():
            df = df[df[key] == (str(value) if key in TAGS else value)]
        return df


def open_store(uri: str, experiment: str = "hacrl", *, must_exist: bool = True) -> Store:
    """Read every run of `experiment` (one query per 5000 runs).

    Reading creates nothing: with `must_exist` (the default) a sqlite store that is not there
    raises StoreError naming its path. Any fault opening the store is one line (StoreError).
    """
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # a report downloads hundreds of small outcome files: no progress bar for each
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from hacrl.core.errors import StoreError, one_line
    from hacrl.tracking.mlflow_store import open_client

    with open_client(uri, create=not must_exist) as client:
        try:
            found = client.get_experiment_by_name(experiment)
        except Exception as err:  # the store opened but does not answer usably
            raise StoreError(f"cannot read experiment {experiment!r} from the MLflow store "
                             f"{uri}: {one_line(err)}") from None
    rows: list[dict[str, Any]] = []
    if found is not None:
        token = None
        while True:
            page = client.search_runs([found.experiment_id], max_results=5000, page_token=token)
            rows.extend(_row(run) for run in page)
            token = page.token
            if not token:
                break
    columns = ["run_id", "status", "start_time", "artifact_uri", *TAGS, *(f"param:{p}" for p in PARAMS)]
    df = pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)
    for column in columns:
        if column not in df:
            df[column] = None
    return Store(uri, experiment, df.sort_values("start_time", ascending=False,
                                                 ignore_index=True), client)


def _row(run: Any) -> dict[str, Any]:
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
    row: dict[str, Any] = {"run_id": run.info.run_id, "status": run.info.status,
                           "start_time": run.info.start_time or 0,
                           "artifact_uri": run.info.artifact_uri}
    for tag in TAGS:
        row[tag] = tags.get(tag)
    for param in PARAMS:
        row[f"param:{param}"] = params.get(param)
    for key, value in metrics.items():
        if key.startswith(METRIC_PREFIXES):
            row[key] = value
    return row
