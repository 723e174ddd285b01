"""Seed groups in MLflow: the job runs of one sweep cell's seeds nested under one run that holds,
per agent score, the mean over the seeds and its 95% interval (MLflow computes no intervals).

A job run's `seed_group` tag is its training identity without the seed
(`hacrl.config.identity.seed_group`): the seeds of one cell (same method, team and settings)
share it. For each group with a FINISHED job run, one run of kind `seed_group`
(`hacrl.schema.tags.GROUP`), named like its jobs with the number of seeds for the seed
(`hacpo · <pair> · 8 seeds`), holds for every final score its job runs log (`avg/<model>`,
`acc/<benchmark>/<model>`, `<protocol>/...`: `metric_names.job_score`)

    S            the mean over seeds (the column the seeds' own values are in)
    ci_low/S     the mean's 95% t-interval over seeds (n - 1 df), kept in [0, 1]
    ci_high/S    (`analysis.seed_stats.seed_mean`); absent with one seed: no interval, never a
                 zero-width one (tag `interval` says so)
    seeds/S      the number of seeds with that score

over the latest FINISHED job run of each seed (a cell run again counts once, as in the report).
Every job run of the group, whatever its status, gets the MLflow parent tag
(`mlflow.parentRunId`) of the group run, so the UI's runs list nests seed group -> job -> agents
(its nesting has any depth). Writing again updates the same group run, found by its tag: new
values at the next step (`hacrl.revision`: the latest is what the UI shows), nothing when
nothing changed; a group that lost a value it had (fewer seeds: one left, no interval) gets a new
run in place of the old; a group run whose jobs are all gone is deleted.

Job runs logged before the tag existed are placed by `derive` (their params -> their
seed_group, or None; the command line hands in `hacrl.config.seed_group_of_logged`, which
checks the rebuilt identity against the run's own config hash) and tagged; a run it cannot
place stays ungrouped and is counted (`SeedGroups.unplaced`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from analysis.seed_stats import seed_mean
from hacrl.schema import metric_names as M
from hacrl.schema import tags as T

# a job run's params and config hash -> its seed group, or None when they do not say
Derive = Callable[[Mapping[str, str], str], str | None]
# tags a group run takes from its jobs (equal on all of them: they are the identity's)
SHARED_TAGS = (T.PAIR, T.SETTING, T.METHOD, T.SCALE, T.ENGINE, T.PROFILE, T.TIMING_REPEAT)
LEVEL = 0.95


@dataclass(frozen=True)
class GroupValues:
    """What one group run holds: its metrics and tags, from its seeds' job runs."""

    seeds: tuple[str, ...]             # the seeds counted (one FINISHED job run each)
    metrics: dict[str, float]          # S and its `metric_names.seed_stat`s per job score S
    interval: str                      # the `interval` tag: which interval, or why none


@dataclass
class SeedGroups:
    """What `update_seed_groups` did."""

    groups: dict[str, str] = field(default_factory=dict)  # seed group -> its group run
    written: int = 0                   # group runs created or given new values
    unchanged: int = 0
    nested: int = 0                    # job runs under a group run
    placed: int = 0                    # job runs without the tag, placed by their params (tagged)
    unplaced: list[str] = field(default_factory=list)  # job runs no group could be found for
    deleted: int = 0                   # group runs replaced or left without jobs

    def line(self) -> str:
        """One line for the command's output."""
        if not self.groups and not self.unplaced:
            return "seed groups: no finished job runs to group"
        text = (f"seed groups: {len(self.groups)} group runs in MLflow ({self.written} written, "
                f"{self.unchanged} unchanged), {self.nested} job runs nested under them")
        if self.placed:
            text += f"; {self.placed} job runs from before the seed_group tag placed by their params"
        if self.unplaced:
            text += (f"; {len(self.unplaced)} job runs left ungrouped (no seed_group tag, and "
                     f"their params do not rebuild their config hash): "
                     f"{', '.join(self.unplaced[:5])}{' ...' if len(self.unplaced) > 5 else ''}")
        return text


def seed_key(seed: str) -> tuple[int, float, str]:
    """Seeds in numeric order (`0, 1, 42`), anything else after them."""
    try:
        return 0, float(seed), seed
    except ValueError:
        return 1, 0.0, seed


def counted_runs(runs: Iterable[Any]) -> list[Any]:
    """The runs a group's values are over: the latest FINISHED job run of each cell (config
    hash), in seed order."""
    latest: dict[str, Any] = {}
    for run in runs:
        if run.info.status != "FINISHED":
            continue
        cell = run.data.tags.get(T.CONFIG_HASH) or run.info.run_id
        if cell not in latest or run.info.start_time > latest[cell].info.start_time:
            latest[cell] = run
    return sorted(latest.values(), key=lambda r: seed_key(r.data.tags.get(T.SEED, "")))


def group_values(runs: list[Any], level: float = LEVEL) -> GroupValues:
    """The mean, interval and count over `runs` (`counted_runs`) of each job score they log."""
    scores: dict[str, list[float]] = {}
    for run in runs:
        for name, value in run.data.metrics.items():
            if M.parse_job_score(name) is not None:
                scores.setdefault(name, []).append(float(value))
    metrics: dict[str, float] = {}
    counts = set()
    for name in sorted(scores):
        stats = seed_mean(scores[name], level=level)
        assert stats.mean is not None
        metrics[name] = stats.mean
        metrics[M.seed_stat(name, "n")] = float(stats.n)
        counts.add(stats.n)
        if stats.lo is not None and stats.hi is not None:
            metrics[M.seed_stat(name, "low")] = stats.lo
            metrics[M.seed_stat(name, "high")] = stats.hi
    if not counts:
        interval = "no scores logged"
    elif max(counts) < 2:
        interval = "one seed: no interval"
    else:
        interval = f"{level:.0%} t-interval"
        if min(counts) < 2:
            interval += " (none for a score of one seed)"
    seeds = tuple(str(r.data.tags.get(T.SEED, "")) for r in runs)
    return GroupValues(seeds, metrics, interval)


def group_tags(key: str, runs: list[Any], values: GroupValues) -> dict[str, str]:
    """A group run's tags: its kind and seed group, the identity its jobs share, the sweeps
    that asked for any of them, its seeds and what its interval is."""
    newest = max(runs, key=lambda r: r.info.start_time)
    sweeps = dict.fromkeys(s for r in runs for s in r.data.tags.get(T.SWEEPS, "").split(",") if s)
    tags = {t: newest.data.tags[t] for t in SHARED_TAGS if t in newest.data.tags}
    tags.update({T.KIND: T.GROUP, T.SEED_GROUP: key, T.SEEDS: ",".join(values.seeds),
                 T.INTERVAL: values.interval})
    if sweeps:
        tags[T.SWEEPS] = ",".join(sweeps)
    return tags


def update_seed_groups(uri: str, experiment: str, derive: Derive | None = None) -> SeedGroups:
    """Write (or update) the group run of every seed group among the experiment's job runs and
    nest the job runs under it. Nothing is created in a store or experiment that is not there."""
    from hacrl.tracking import Tracker, standard_tags
    from hacrl.tracking.mlflow_store import open_client

    done = SeedGroups()
    with open_client(uri, create=False) as client:
        if client.get_experiment_by_name(experiment) is None:
            return done
    tracker = Tracker(uri, experiment)
    jobs = tracker.find_runs(T.where({T.KIND: T.JOB}))
    members: dict[str, list[Any]] = {}
    untagged: dict[str, str] = {}  # job run -> the seed group its params gave
    for run in jobs:
        key = run.data.tags.get(T.SEED_GROUP)
        if not key and derive is not None and run.data.tags.get(T.CONFIG_HASH):
            key = derive(run.data.params, run.data.tags[T.CONFIG_HASH])
            if key:
                untagged[run.info.run_id] = key
        if key:
            members.setdefault(key, []).append(run)
        else:
            done.unplaced.append(run.info.run_id)
    existing: dict[str, Any] = {}
    for run in sorted(tracker.find_runs(T.where({T.KIND: T.GROUP})),
                      key=lambda r: r.info.start_time):
        key = run.data.tags.get(T.SEED_GROUP, "")
        if key in existing or not any(r.info.status == "FINISHED" for r in members.get(key, [])):
            tracker.client.delete_run(run.info.run_id)  # a duplicate, or its jobs are gone
            done.deleted += 1
        else:
            existing[key] = run
    source = standard_tags("hacrl report")
    for key, runs in members.items():
        counted = counted_runs(runs)
        if not counted:
            continue  # no finished seed yet: nothing to hold
        values = group_values(counted)
        tags = group_tags(key, runs, values)
        name = T.group_run_name(tags.get(T.METHOD, "?"), tags.get(T.PAIR, "?"), len(counted))
        group = existing.get(key)
        if group is not None and set(group.data.metrics) - set(values.metrics):
            tracker.client.delete_run(group.info.run_id)  # a value it had is gone: start over
            done.deleted += 1
            group = None
        if group is None:
            group_id = tracker.start_run(name, {**source, **tags, T.REVISION: "1"})
            tracker.log_metrics(group_id, values.metrics, 1)
            tracker.finish(group_id)
            done.written += 1
        else:
            group_id = group.info.run_id
            same_tags = all(group.data.tags.get(k) == v for k, v in tags.items())
            if group.data.metrics == values.metrics and same_tags and group.info.run_name == name:
                done.unchanged += 1
            else:
                revision = int(group.data.tags.get(T.REVISION) or 1) + 1
                tracker.log_metrics(group_id, values.metrics, revision)
                tracker.set_tags(group_id, {**tags, T.REVISION: str(revision)})
                if group.info.run_name != name:
                    tracker.client.update_run(group_id, name=name)
                done.written += 1
        done.groups[key] = group_id
        for run in runs:
            link = {T.PARENT: group_id} if run.data.tags.get(T.PARENT) != group_id else {}
            if run.info.run_id in untagged:
                link[T.SEED_GROUP] = key
                done.placed += 1
            if link:
                tracker.set_tags(run.info.run_id, link)
            done.nested += 1
    return done


__all__ = ["GroupValues", "SeedGroups", "counted_runs", "group_values", "update_seed_groups"]
