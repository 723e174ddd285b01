"""Seed groups (`analysis.seed_groups`): the job runs of one cell's seeds nested in the MLflow UI
under a group run holding the mean over the seeds and its 95% t-interval, per agent score.

Real jobs on the micro zoo into a real sqlite store (three seeds of a HACPO cell, one seed of a
GSPO cell), then the group runs written, rewritten, extended by a seed, cut to one seed, and
found again for runs from before the `seed_group` tag; the tag itself from composed configs."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from scipy import stats as sps

from analysis.seed_groups import update_seed_groups
from analysis.seed_stats import seed_mean
from hacrl.config import compose, seed_group, seed_group_of_logged, validate
from hacrl.schema import metric_names as M
from hacrl.schema import tags as T

EXPERIMENT = "hacrl-tiny"
HACPO_SEEDS = (0, 1, 2)
SCORING = ("task.train_split=tiny_gsm8k", "validation.benchmark=tiny_gsm8k",
           "eval.benchmarks=[tiny_gsm8k,tiny_aime2025]")  # where the micro models score


@pytest.fixture(scope="module")
def jobs(micro_zoo: Path, data_root: Path, tiny_job: list[str],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A store holding three seeds of HACPO on the size pair and one seed of GSPO on one
    model, each a real job; the specs by (method, seed)."""
    import torch

    from hacrl.job import run_job

    root = tmp_path_factory.mktemp("seed-groups") / "out"
    threads = torch.get_num_threads()
    specs = {}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HACRL_ZOO_DIR", str(micro_zoo))
        env.setenv("HACRL_DATA", str(data_root))
        env.delenv("MLFLOW_TRACKING_URI", raising=False)
        for method, seed, extra in [*(("hacpo", s, []) for s in HACPO_SEEDS),
                                    ("gspo", 0, ["pair=model_small"])]:
            spec = validate(compose([*tiny_job, *SCORING, f"output_root={root}",
                                     f"method={method}", f"seed={seed}", *extra]))
            assert run_job(spec, progress=False)["status"] == "FINISHED"
            specs[(method, seed)] = spec
    torch.set_num_threads(threads)
    yield {"root": root, "specs": specs}


@pytest.fixture
def store(jobs: dict[str, Any], tmp_path: Path) -> str:
    """A copy of the jobs' store for one test (the group runs it writes stay in it)."""
    shutil.copy(jobs["root"] / "mlflow.db", tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _runs(uri: str, kind: str) -> list[Any]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    assert exp is not None
    return list(client.search_runs([exp.experiment_id], T.where({T.KIND: kind}),
                                   max_results=1000))


def _group(uri: str, key: str) -> Any:
    (run,) = [r for r in _runs(uri, T.GROUP) if r.data.tags[T.SEED_GROUP] == key]
    return run


def _t_interval(values: list[float]) -> tuple[float, float]:
    """The textbook 95% t-interval of a mean, for comparison."""
    half = sps.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return statistics.fmean(values) - half, statistics.fmean(values) + half


def test_the_seed_group_is_the_identity_without_the_seed(micro_zoo, data_root, monkeypatch,
                                                          tiny_job) -> None:
    """Seeds of one cell share it, any other setting splits it; config hashes are what they
    were; a run's logged params rebuild it exactly (checked against its config hash)."""
    from hacrl.job.runs import training_params

    monkeypatch.setenv("HACRL_ZOO_DIR", str(micro_zoo))

    def spec(*extra: str) -> Any:
        return validate(compose([*tiny_job, *extra]))

    base = spec("seed=0")
    assert seed_group(spec("seed=1").cfg) == seed_group(base.cfg)
    assert spec("seed=1").config_hash != base.config_hash
    for other in (["algo.alpha=3"], ["method=naive"], ["train.steps=3"], ["timing_repeat=1"],
                  ["pair=state"], ["scale.zoo_seed=1"]):
        assert seed_group(compose([*tiny_job, "seed=0", *other])) != seed_group(base.cfg), other
    for extra in ([], ["method=gspo", "pair=model_small", "seed=42"], ["method=grpo"],
                  ["algo.alpha=3", "rollout.temperature=0.7"]):
        s = spec(*extra)
        assert seed_group_of_logged(training_params(s), s.config_hash) == seed_group(s.cfg)
    params = training_params(base)
    assert seed_group_of_logged(params, "0123456789ab") is None  # not this run's identity
    assert seed_group_of_logged({**params, "train.lr": "0.5"}, base.config_hash) is None
    assert seed_group_of_logged({}, base.config_hash) is None


@pytest.mark.slow
def test_group_runs_hold_the_mean_and_t_interval_over_seeds(jobs, store) -> None:
    done = update_seed_groups(store, EXPERIMENT, seed_group_of_logged)
    specs = jobs["specs"]
    hacpo_key, gspo_key = seed_group(specs[("hacpo", 0)].cfg), seed_group(specs[("gspo", 0)].cfg)
    assert set(done.groups) == {hacpo_key, gspo_key} and done.written == 2
    assert done.unplaced == [] and done.placed == 0
    job_runs = _runs(store, T.JOB)
    seeds = [r for r in job_runs if r.data.tags[T.METHOD] == "hacpo"]
    assert sorted(int(r.data.tags[T.SEED]) for r in seeds) == list(HACPO_SEEDS)
    # the tag every job run got when it started: one value for the cell's seeds
    assert {r.data.tags[T.SEED_GROUP] for r in seeds} == {hacpo_key}
    group = _group(store, hacpo_key)
    assert group.info.status == "FINISHED" and group.data.tags[T.KIND] == T.GROUP
    assert group.info.run_name == f"hacpo · {seeds[0].data.tags[T.PAIR]} · 3 seeds"
    assert group.data.tags[T.SEEDS] == "0,1,2"
    assert group.data.tags[T.INTERVAL] == "95% t-interval"
    assert T.CONFIG_HASH not in group.data.tags  # never taken for a cell's run
    scores = sorted({k for r in seeds for k in r.data.metrics if M.parse_job_score(k)})
    models = {M.parse_job_score(k)[2] for k in scores}  # type: ignore[index]
    assert models == {"qwen3-1.7b-base", "qwen3-4b-base"}
    assert len(scores) == 6  # avg, tiny_gsm8k, tiny_aime2025 of each agent
    varied = 0
    for score in scores:
        values = [r.data.metrics[score] for r in seeds]
        mean = group.data.metrics[score]
        assert mean == pytest.approx(statistics.fmean(values), abs=1e-12)
        assert group.data.metrics[M.seed_stat(score, "n")] == 3
        expected = seed_mean(values)
        low = group.data.metrics[M.seed_stat(score, "low")]
        high = group.data.metrics[M.seed_stat(score, "high")]
        assert (low, high) == (expected.lo, expected.hi)
        assert 0 <= low <= mean <= high <= 1
        t_low, t_high = _t_interval(values)
        if len(set(values)) > 1 and 0.05 < t_low and t_high < 0.95:
            # mid-range the textbook t-interval, to a fraction of the SE (about half of one at
            # 3 seeds, whose t is 4.3); towards 0 or 1 it turns asymmetric instead of crossing
            # the bound (`analysis.stats.bounded_interval`)
            varied += 1
            se = statistics.stdev(values) / math.sqrt(len(values))
            assert high - low == pytest.approx(t_high - t_low, rel=0.1)
            assert low == pytest.approx(t_low, abs=0.75 * se)
    assert varied >= 2, "the seeds' scores should differ"
    # the report's own columns are untouched: the group is no cell's run
    assert not {k for k in group.data.metrics if k.startswith(M.REPORTED_PREFIXES)}


@pytest.mark.slow
def test_one_seed_gets_no_interval(jobs, store) -> None:
    update_seed_groups(store, EXPERIMENT, seed_group_of_logged)
    group = _group(store, seed_group(jobs["specs"][("gspo", 0)].cfg))
    (job,) = [r for r in _runs(store, T.JOB) if r.data.tags[T.METHOD] == "gspo"]
    assert group.info.run_name == f"gspo · {job.data.tags[T.PAIR]} · 1 seed"
    assert group.data.tags[T.INTERVAL] == "one seed: no interval"
    scores = [k for k in job.data.metrics if M.parse_job_score(k)]
    assert scores and set(group.data.metrics) == {
        *scores, *(M.seed_stat(s, "n") for s in scores)}  # no low, no high: not even 0-wide
    for score in scores:
        assert group.data.metrics[score] == job.data.metrics[score]
        assert group.data.metrics[M.seed_stat(score, "n")] == 1


@pytest.mark.slow
def test_job_runs_are_nested_under_their_group(jobs, store) -> None:
    done = update_seed_groups(store, EXPERIMENT, seed_group_of_logged)
    assert done.nested == 4
    client = MlflowClient(store)
    for job in _runs(store, T.JOB):
        group = done.groups[job.data.tags[T.SEED_GROUP]]
        assert job.data.tags[T.PARENT] == group
        assert client.get_run(group).data.tags[T.SEED_GROUP] == job.data.tags[T.SEED_GROUP]
    for agent in _runs(store, T.AGENT):  # still under their job: three levels
        parent = client.get_run(agent.data.tags[T.PARENT])
        assert parent.data.tags[T.KIND] == T.JOB
    assert {r.info.run_id for r in _runs(store, T.GROUP)} == set(done.groups.values())


@pytest.mark.slow
def test_writing_again_updates_the_same_group_run(jobs, store) -> None:
    """Again: nothing written, nothing new. A new seed: the same run, new values at the next
    step, its name and seeds updated. Down to one seed: a new run without the interval."""
    first = update_seed_groups(store, EXPERIMENT, seed_group_of_logged)
    again = update_seed_groups(store, EXPERIMENT, seed_group_of_logged)
    assert again.groups == first.groups and again.written == 0 and again.unchanged == 2
    assert len(_runs(store, T.GROUP)) == 2
    key = seed_group(jobs["specs"][("hacpo", 0)].cfg)
    before = _group(store, key)
    assert before.data.tags[T.REVISION] == "1"

    # a fourth seed, logged as a job logs it
    seeds = sorted((r for r in _runs(store, T.JOB) if r.data.tags[T.METHOD] == "hacpo"),
                   key=lambda r: int(r.data.tags[T.SEED]))
    scores = {k: v for k, v in seeds[0].data.metrics.items() if M.parse_job_score(k)}
    new = {k: min(1.0, v + 0.25) for k, v in scores.items()}
    run = _log_job(store, seeds[0], 7, "0000000seed7", new)
    grown = update_seed_groups(store, EXPERIMENT, seed_group_of_logged)
    assert grown.groups == first.groups and grown.written == 1 and grown.unchanged == 1
    after = _group(store, key)
    assert after.info.run_id == before.info.run_id and len(_runs(store, T.GROUP)) == 2
    assert after.info.run_name.endswith(" · 4 seeds") and after.data.tags[T.SEEDS] == "0,1,2,7"
    assert after.data.tags[T.REVISION] == "2"
    for score, value in new.items():
        values = [r.data.metrics[score] for r in seeds] + [value]
        assert after.data.metrics[score] == pytest.approx(statistics.fmean(values), abs=1e-12)
        assert after.data.metrics[M.seed_stat(score, "n")] == 4
        assert after.data.metrics[M.seed_stat(score, "low")] == seed_mean(values).lo
    assert MlflowClient(store).get_run(run).data.tags[T.PARENT] == after.info.run_id

    # seeds deleted down to one: no interval left over from before
    client = MlflowClient(store)
    for r in [*seeds[1:], client.get_run(run)]:
        client.delete_run(r.info.run_id)
    shrunk = update_seed_groups(store, EXPERIMENT, seed_group_of_logged)
    alone = _group(store, key)
    assert shrunk.deleted == 1 and alone.info.run_id != before.info.run_id
    assert not [k for k in alone.data.metrics if k.startswith(("ci_low/", "ci_high/"))]
    assert alone.data.tags[T.INTERVAL] == "one seed: no interval"
    assert client.get_run(seeds[0].info.run_id).data.tags[T.PARENT] == alone.info.run_id
    # and every job gone: the group run goes too
    client.delete_run(seeds[0].info.run_id)
    update_seed_groups(store, EXPERIMENT, seed_group_of_logged)
    assert [r.data.tags[T.SEED_GROUP] for r in _runs(store, T.GROUP)] != [key]
    assert key not in {r.data.tags[T.SEED_GROUP] for r in _runs(store, T.GROUP)}


def _log_job(uri: str, like: Any, seed: int, config_hash: str, scores: dict[str, float],
             status: str = "FINISHED") -> str:
    """A job run logged as a job logs it: `like`'s tags but seed and config hash."""
    from hacrl.tracking import Tracker

    tags = {k: v for k, v in like.data.tags.items() if not k.startswith("mlflow.")}
    tags.update({T.SEED: str(seed), T.CONFIG_HASH: config_hash})
    tracker = Tracker(uri, EXPERIMENT)
    run = tracker.start_run(T.job_run_name(tags[T.METHOD], tags[T.PAIR], seed), tags)
    tracker.log_metrics(run, scores, 2)
    tracker.finish(run, status)
    return run


@pytest.mark.slow
def test_a_cell_run_again_counts_once_and_unfinished_runs_not_at_all(jobs, store) -> None:
    """The latest FINISHED job run of each cell is its seed's value (as in the report); a
    FAILED run is nested with its group but counts for nothing."""
    seeds = sorted((r for r in _runs(store, T.JOB) if r.data.tags[T.METHOD] == "hacpo"),
                   key=lambda r: int(r.data.tags[T.SEED]))
    scores = {k: v for k, v in seeds[0].data.metrics.items() if M.parse_job_score(k)}
    again = {k: round(v / 2, 6) for k, v in scores.items()}
    _log_job(store, seeds[0], 0, seeds[0].data.tags[T.CONFIG_HASH], again)  # seed 0 run again
    failed = _log_job(store, seeds[0], 9, "00000000seed9", dict.fromkeys(scores, 1.0), "FAILED")
    done = update_seed_groups(store, EXPERIMENT, seed_group_of_logged)
    group = _group(store, seed_group(jobs["specs"][("hacpo", 0)].cfg))
    assert group.data.tags[T.SEEDS] == "0,1,2" and group.info.run_name.endswith(" · 3 seeds")
    for score, value in again.items():
        values = [value, *(r.data.metrics[score] for r in seeds[1:])]
        assert group.data.metrics[score] == pytest.approx(statistics.fmean(values), abs=1e-12)
        assert group.data.metrics[M.seed_stat(score, "n")] == 3
    assert MlflowClient(store).get_run(failed).data.tags[T.PARENT] == group.info.run_id
    assert done.nested == 6


@pytest.mark.slow
def test_runs_from_before_the_tag_are_placed_by_their_params(jobs, store) -> None:
    client = MlflowClient(store)
    job_runs = _runs(store, T.JOB)
    expected = {r.info.run_id: r.data.tags[T.SEED_GROUP] for r in job_runs}
    for run in job_runs:
        client.delete_tag(run.info.run_id, T.SEED_GROUP)
    # without a way to read params: nothing grouped, each run said
    skipped = update_seed_groups(store, EXPERIMENT)
    assert skipped.groups == {} and sorted(skipped.unplaced) == sorted(expected)
    assert "4 job runs left ungrouped" in skipped.line() and _runs(store, T.GROUP) == []
    # a run whose params do not rebuild its config hash stays out
    odd = job_runs[0].info.run_id
    client.set_tag(odd, T.CONFIG_HASH, "ffffffffffff")
    placed = update_seed_groups(store, EXPERIMENT, seed_group_of_logged)
    assert placed.unplaced == [odd] and placed.placed == 3
    assert "3 job runs from before the seed_group tag placed by their params" in placed.line()
    for run in _runs(store, T.JOB):
        if run.info.run_id == odd:
            assert T.SEED_GROUP not in run.data.tags and T.PARENT not in run.data.tags
        else:  # tagged now, with what the job would have tagged, and nested
            assert run.data.tags[T.SEED_GROUP] == expected[run.info.run_id]
            assert run.data.tags[T.PARENT] == placed.groups[expected[run.info.run_id]]


@pytest.mark.slow
def test_ui_views_list_the_groups_and_nest_the_jobs(jobs, store) -> None:
    from hacrl.tracking.ui_views import write_group_views, write_views

    client = MlflowClient(store)
    found_exp = client.get_experiment_by_name(EXPERIMENT)
    assert found_exp is not None
    experiment = found_exp.experiment_id
    assert write_group_views(client, experiment) == {}  # no groups yet: no view
    models = sorted({a.name for spec in jobs["specs"].values() for a in spec.agents})

    def jobs_view() -> dict[str, Any]:
        write_views(client, experiment)
        return json.loads(client.get_experiment(experiment).tags[
            "mlflow.sharedViewState.hacrl-jobs"])

    assert [c for c in jobs_view()["selectedColumns"] if "avg/" in c] == [
        f"metrics.`avg/{m}`" for m in models]
    done = update_seed_groups(store, EXPERIMENT, seed_group_of_logged)
    keys = write_group_views(client, experiment)
    assert keys == {None: "hacrl_groups"}  # the jobs ran outside a sweep
    state = json.loads(client.get_experiment(experiment).tags[
        "mlflow.sharedViewState.hacrl_groups"])
    found = client.search_runs([experiment], state["searchFilter"])
    assert {r.info.run_id for r in found} == set(done.groups.values())
    columns = state["selectedColumns"]
    assert columns[:4] == ["tags.`method`", "tags.`pair`", "tags.`seeds`", "tags.`interval`"]
    assert len(models) == 3 and columns[4:] == [  # each agent's AVG, no other score
        f"metrics.`{stat}avg/{m}`" for m in models for stat in ("", "ci_low/", "ci_high/", "seeds/")]
    # in this order (the UI sorts metric columns by name otherwise), each wide enough for its
    # name, a tag's also for its values
    assert state["columnOrder"] == columns and set(state["columnWidths"]) == set(columns)
    pairs = {r.data.tags[T.PAIR] for r in found}
    assert state["columnWidths"]["tags.`pair`"] >= 7 * max(map(len, pairs))
    assert all(state["columnWidths"][c] >= 7 * len(c.split("`")[1]) for c in columns)
    # the jobs view: sorted by start time (the UI nests the jobs under their groups then, and
    # fetches the groups the filter leaves out); the groups' means in the AVG columns
    state = jobs_view()
    assert state["orderByKey"] == "attributes.start_time"
    assert [c for c in state["selectedColumns"] if "avg/" in c] == [
        f"metrics.`avg/{m}`" for m in models]


@pytest.mark.slow
def test_hacrl_report_writes_the_groups(jobs, store, tmp_path, capsys) -> None:
    from hacrl.cli.main import main

    assert main(["report", "table2", f"output_root={tmp_path}", "--no-mlflow"]) == 0
    assert "seed groups" not in capsys.readouterr().out and _runs(store, T.GROUP) == []
    assert main(["report", "table2", f"output_root={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "seed groups: 2 group runs in MLflow (2 written, 0 unchanged), 4 job runs nested " \
           "under them" in out
    assert len(_runs(store, T.GROUP)) == 2
