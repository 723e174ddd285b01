"""Saved views of the MLflow UI's runs list: the jobs of each sweep as a results table.

The MLflow UI keeps a shared view as an experiment tag `mlflow.sharedViewState.<key>` whose
value is the runs page's state as JSON (search filter, sort, visible columns, ...) and opens it
from a link `#/experiments/<id>/runs?viewStateShareKey=<key>` (its "Share" button writes the same
tags). `hacrl ui` writes one view per sweep found among an experiment's job runs, plus one of all
jobs, and prints their links: the runs named `<method> · <pair> · seed <s>` with the method,
pair and seed tags and each agent's AVG (`avg/<model>`) as columns, newest first.

Job runs that belong to a seed group (`analysis.seed_groups`) are nested under its run (the MLflow
parent tag). The UI (MLflow 3.17's runs table) fetches the parents of the runs a filter finds
and nests runs to any depth when the list is sorted by start time, so a jobs view shows one row
per seed group, the mean over its seeds in each `avg/<model>` column, with its seeds below it
(the row's expander; a shared view cannot open them: the UI drops `runsExpanded` from it). Job runs not in a group yet are rows of their own. Every view shows
its columns in the order listed, each wide enough for its name (`widths`). A view of the group
runs (all, and per sweep: `write_group_views`) shows each agent's AVG as the mean, the low and
high end of its 95% interval and the number of seeds (`avg/<model>`, `ci_low/avg/<model>`,
`ci_high/...`, `seeds/...`). (The UI's own "Group by" a tag was the other way: its group rows
are computed in the browser, average, min or max of the runs, and cannot show an interval.)
"""

from __future__ import annotations

import json
from typing import Any

from hacrl.schema import metric_names as M
from hacrl.schema import tags as T

VIEW_TAG = "mlflow.sharedViewState."
VIEW_PREFIX = "hacrl-"
COLUMN_TAGS = (T.METHOD, T.PAIR, T.SEED)
GROUP_VIEW = "hacrl_groups"  # and `hacrl_groups.<sweep>`: never a sweep view's `hacrl-<name>`
GROUP_COLUMN_TAGS = (T.METHOD, T.PAIR, T.SEEDS, T.INTERVAL)


def column(kind: str, name: str) -> str:
    """A runs-table column key as the UI names it (as a search filter names it: `T.ref` for a
    tag): tags.`method`, metrics.`avg/<model>`, attributes.`Dataset`."""
    return T.ref(name).replace("tags.", f"{kind}.", 1)


def view_state(search_filter: str, columns: list[str],
               widths: dict[str, int] | None = None) -> dict[str, Any]:
    """The runs page's whole state (every field the UI restores, its defaults elsewhere).
    `widths` (column -> pixels): the columns shown in the order given at these widths (the UI
    sorts metric columns by name otherwise, in columns too narrow for a model's name)."""
    return {
        # search facets
        "searchFilter": search_filter, "orderByKey": "attributes.start_time",
        "orderByAsc": False, "startTime": "ALL", "lifecycleFilter": "Active",
        "modelVersionFilter": "All Runs", "datasetsFilter": [],
        # table and charts
        "selectedColumns": columns, "columnOrder": list(columns) if widths else [],
        "columnWidths": dict(widths or {}),
        "runsExpanded": {}, "runsPinned": [], "runsHidden": [], "runsVisibilityMap": {},
        "runsHiddenMode": "FIRST_10_RUNS", "viewMaximized": False, "runListHidden": False,
        "isAccordionReordered": False, "groupBy": None, "groupsExpanded": {},
        "autoRefreshEnabled": True, "useGroupedValuesInCharts": True, "hideEmptyCharts": True,
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0,
                                  "selectedXAxisMetricKey": ""},
    }


def jobs_filter(sweep: str | None = None, kind: str = T.JOB) -> str:
    where = T.where({T.KIND: kind})
    return where if sweep is None else f"{where} and {T.ref(T.SWEEPS)} LIKE '%{sweep}%'"


def widths(columns: list[str], runs: list[Any]) -> dict[str, int]:
    """Pixels for each column to show its name, and a tag's longest value among `runs`."""
    out = {}
    for key in columns:
        kind, _, rest = key.partition(".")
        name = rest.strip("`")
        texts = [name, *(r.data.tags.get(name, "") for r in runs)] if kind == "tags" else [name]
        out[key] = min(300, max(90, 8 * max(len(t) for t in texts) + 30))
    return out


def _by_sweep(runs: list[Any]) -> dict[str | None, list[Any]]:
    """None -> all runs, and each sweep a run names (`hacrl.sweeps`) -> its runs."""
    found: dict[str | None, list[Any]] = {None: list(runs)}
    for run in runs:
        for sweep in filter(None, run.data.tags.get(T.SWEEPS, "").split(",")):
            found.setdefault(sweep, []).append(run)
    return found


def write_views(client: Any, experiment_id: str) -> dict[str, str]:
    """Write the views of one experiment (replacing hacrl's earlier ones); view name -> key.

    None when the experiment holds no job run."""
    jobs = client.search_runs([experiment_id], jobs_filter(), max_results=5000)
    keys = {}
    for sweep, runs in _by_sweep(jobs).items():
        if not runs:
            continue
        name = sweep or "jobs"
        columns = [*(column("tags", t) for t in COLUMN_TAGS),
                   *(column("metrics", m) for m in _avg_columns(runs, False)),
                   column("attributes", "Dataset")]
        key = f"{VIEW_PREFIX}{name}"
        state = view_state(jobs_filter(sweep), columns, widths(columns, runs))
        client.set_experiment_tag(experiment_id, f"{VIEW_TAG}{key}", json.dumps(state))
        keys[name] = key
    return keys


def write_group_views(client: Any, experiment_id: str) -> dict[str | None, str]:
    """Write the views of the experiment's seed-group runs (`analysis.seed_groups`): one of
    all of them (None) and one per sweep; None or sweep -> key. Each agent's AVG as four
    columns: the mean over seeds, the low and high end of its 95% interval, the seeds."""
    found = client.search_runs([experiment_id], jobs_filter(kind=T.GROUP), max_results=5000)
    keys = {}
    for sweep, runs in _by_sweep(found).items():
        if not runs:
            continue
        columns = [*(column("tags", t) for t in GROUP_COLUMN_TAGS),
                   *(column("metrics", m) for m in _avg_columns(runs, True))]
        key = GROUP_VIEW if sweep is None else f"{GROUP_VIEW}.{sweep}"
        state = view_state(jobs_filter(sweep, T.GROUP), columns, widths(columns, runs))
        client.set_experiment_tag(experiment_id, f"{VIEW_TAG}{key}", json.dumps(state))
        keys[sweep] = key
    return keys


def _avg_columns(runs: list[Any], grouped: bool) -> list[str]:
    """Each agent's AVG (`avg/<model>`, the main protocol's) among the runs' metrics; `grouped`:
    each followed by a seed group's `low`, `high` and `n` of it."""
    scores = sorted({k for r in runs for k in r.data.metrics
                     if (p := M.parse_job_score(k)) and p[0] is None and p[1] == M.AVG})
    stats = M.SEED_STATS if grouped else ()
    return [name for s in scores for name in (s, *(M.seed_stat(s, stat) for stat in stats))]


def view_url(base: str, experiment_id: str, key: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs?viewStateShareKey={key}"


__all__ = ["column", "jobs_filter", "view_state", "view_url", "write_group_views", "write_views"]
