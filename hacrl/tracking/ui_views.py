"""Saved views of the MLflow UI's runs list: the jobs of each sweep as a results table.

The MLflow UI keeps a shared view as an experiment tag `mlflow.sharedViewState.<key>` whose
value is the runs page's state as JSON (search filter, sort, visible columns, ...) and opens it
from a link `#/experiments/<id>/runs?viewStateShareKey=<key>` (its "Share" button writes the same
tags). `hacrl ui` writes one view per sweep found among an experiment's job runs, plus one of all
jobs, and prints their links: the runs named `<method> · <pair> · seed <s>` with the method,
pair and seed tags and each agent's AVG (`avg/<model>`) as columns, newest first.
"""

from __future__ import annotations

import json
from typing import Any

from hacrl.schema import metric_names as M
from hacrl.schema import tags as T

VIEW_TAG = "mlflow.sharedViewState."
VIEW_PREFIX = "hacrl-"
COLUMN_TAGS = (T.METHOD, T.PAIR, T.SEED)


def column(kind: str, name: str) -> str:
    """A runs-table column key as the UI names it (as a search filter names it: `T.ref` for a
    tag): tags.`method`, metrics.`avg/<model>`, attributes.`Dataset`."""
    return T.ref(name).replace("tags.", f"{kind}.", 1)


def view_state(search_filter: str, columns: list[str]) -> dict[str, Any]:
    """The runs page's whole state (every field the UI restores, its defaults elsewhere)."""
    return {
        # search facets
        "searchFilter": search_filter, "orderByKey": "attributes.start_time",
        "orderByAsc": False, "startTime": "ALL", "lifecycleFilter": "Active",
        "modelVersionFilter": "All Runs", "datasetsFilter": [],
        # table and charts
        "selectedColumns": columns, "columnOrder": [], "columnWidths": {},
        "runsExpanded": {}, "runsPinned": [], "runsHidden": [], "runsVisibilityMap": {},
        "runsHiddenMode": "FIRST_10_RUNS", "viewMaximized": False, "runListHidden": False,
        "isAccordionReordered": False, "groupBy": None, "groupsExpanded": {},
        "autoRefreshEnabled": True, "useGroupedValuesInCharts": True, "hideEmptyCharts": True,
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0,
                                  "selectedXAxisMetricKey": ""},
    }


def jobs_filter(sweep: str | None = None) -> str:
    where = T.where({T.KIND: T.JOB})
    return where if sweep is None else f"{where} and {T.ref(T.SWEEPS)} LIKE '%{sweep}%'"


def write_views(client: Any, experiment_id: str) -> dict[str, str]:
    """Write the views of one experiment (replacing hacrl's earlier ones); view name -> key.

    None when the experiment holds no job run."""
    jobs = client.search_runs([experiment_id], jobs_filter(), max_results=5000)
    groups: dict[str, list[Any]] = {"jobs": list(jobs)}
    for run in jobs:
        for sweep in filter(None, run.data.tags.get(T.SWEEPS, "").split(",")):
            groups.setdefault(sweep, []).append(run)
    keys = {}
    for name, runs in groups.items():
        if not runs:
            continue
        models = sorted({k for r in runs for k in r.data.metrics if k.startswith(M.JOB_AVG)})
        columns = [*(column("tags", t) for t in COLUMN_TAGS),
                   *(column("metrics", m) for m in models), column("attributes", "Dataset")]
        key = f"{VIEW_PREFIX}{name}"
        state = view_state(jobs_filter(None if name == "jobs" else name), columns)
        client.set_experiment_tag(experiment_id, f"{VIEW_TAG}{key}", json.dumps(state))
        keys[name] = key
    return keys


def view_url(base: str, experiment_id: str, key: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs?viewStateShareKey={key}"


__all__ = ["column", "jobs_filter", "view_state", "view_url", "write_views"]
