"""Evaluate a model and log the result into its MLflow run: `hacrl eval` and end of training.

An evaluation is identified by (model checkpoint, protocol key). The agent run of a training
job holds its checkpoint's evaluations; a zoo or hub model's base evaluation gets a run of its
own (method `base`), found again by model path and scale. The run's tags record, per protocol
name P: `hacrl.eval.P.key` (the protocol hash), `hacrl.eval.P.benchmarks`, the backend and the
protocol itself; metrics are `eval/P/<benchmark>/<metric>` and `eval/P/avg/<metric>`; artifacts
under `eval/P/` (names: `hacrl.schema.eval_artifacts`) hold the protocol, the resolved lm-eval
tasks, every response with its grade, and the compact per-sample outcomes table.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hacrl.config.protocol import Protocol, benchmark_data, evaluated_benchmarks
from hacrl.core.layout import RunDir
from hacrl.evaluation.lmeval import Backend, EvalOutcome, run_lm_eval, write_samples
from hacrl.schema import eval_artifacts as A
from hacrl.schema import metric_names as M
from hacrl.schema import tags as T
from hacrl.tracking import Tracker, standard_tags


@dataclass
class EvalResult:
    run_id: str
    protocol: Protocol
    metrics: dict[str, float]  # flat, as logged
    skipped: bool = False
    seconds: float = 0.0
    shared_with: str | None = None  # another protocol of the same key whose scores were copied


def data_files(cfg: DictConfig, benchmarks: list[str]) -> dict[str, Path]:
    """Local file per benchmark (synthetic ones are written on demand; hub ones must exist)."""
    from hacrl.data import local_file

    return {b: local_file(cfg.data, b) for b in benchmarks}


def already_logged(tracker: Tracker, run_id: str, protocol: Protocol, benchmarks: list[str]) -> bool:
    """The run holds this protocol's evaluation (same key) of at least these benchmarks."""
    run = tracker.client.get_run(run_id)
    tags, metrics = run.data.tags, run.data.metrics
    if tags.get(T.eval_tag(protocol.name, "key")) != protocol.key:
        return False
    done = set(json.loads(tags.get(T.eval_tag(protocol.name, "benchmarks"), "[]")))
    return set(benchmarks) <= done and M.eval_avg(protocol.name) in metrics


def evaluate_into_run(cfg: DictConfig, model_path: str, tracker: Tracker, run_id: str, step: int,
                      force: bool = False) -> list[EvalResult]:
    """Evaluate `model_path` under every protocol of `eval.use` and log into `run_id`.

    A protocol already logged with the same key is skipped unless `force`. Protocols with the
    same settings (same key; e.g. main and ablation at tiny scale) share one lm-eval run: the
    scores are logged under each name. `eval.only` narrows the benchmarks (the protocol key
    stays that of the whole set: the benchmarks tag says which were evaluated).
    """
    benchmarks = evaluated_benchmarks(cfg.eval)
    results: list[EvalResult] = []
    done_by_key: dict[str, tuple[EvalResult, EvalOutcome]] = {}
    for protocol in Protocol.in_use(cfg.eval, data=benchmark_data(cfg)):
        if not force and already_logged(tracker, run_id, protocol, benchmarks):
            run = tracker.client.get_run(run_id)
            prefix = M.eval_prefix(protocol.name) + "/"
            results.append(EvalResult(run_id, protocol, {k: v for k, v in run.data.metrics.items()
                                                         if k.startswith(prefix)}, skipped=True))
            continue
        if protocol.key in done_by_key:
            first, outcome = done_by_key[protocol.key]
            # the outcomes go with the copy: a report reads them by protocol name
            copied = EvalOutcome(outcome.metrics, outcome.average, seconds=0.0,
                                 lm_eval_version=outcome.lm_eval_version,
                                 outcomes=outcome.outcomes)
            _log(cfg, tracker, run_id, step, model_path, protocol, benchmarks, copied, None)
            results.append(EvalResult(run_id, protocol, flat_metrics(protocol, copied),
                                      shared_with=first.protocol.name))
            continue
        earlier = None if force else logged_with_same_key(tracker, run_id, protocol, benchmarks)
        if earlier is not None:
            # logged before under another name with the same settings (a sweep cell done for
            # `main` and now asked for `ablation`): the same scores, not a second evaluation
            name, outcome = earlier
            _log(cfg, tracker, run_id, step, model_path, protocol, benchmarks, outcome, None)
            results.append(EvalResult(run_id, protocol, flat_metrics(protocol, outcome),
                                      shared_with=name))
            done_by_key[protocol.key] = (results[-1], outcome)
            continue
        result, outcome = _evaluate_one(cfg, model_path, tracker, run_id, step, protocol,
                                        benchmarks)
        done_by_key[protocol.key] = (result, outcome)
        results.append(result)
    return results


def logged_with_same_key(tracker: Tracker, run_id: str, protocol: Protocol,
                         benchmarks: list[str]) -> tuple[str, EvalOutcome] | None:
    """Another protocol's evaluation in this run with `protocol`'s key (so its settings and
    data), covering `benchmarks` and with its outcomes table: (its name, the outcome to copy)."""
    run = tracker.client.get_run(run_id)
    tags, metrics = run.data.tags, run.data.metrics
    for tag, key in tags.items():
        name = tag.removeprefix("hacrl.eval.").removesuffix(".key")
        if (not T.is_eval_tag(tag) or tag != T.eval_tag(name, "key") or key != protocol.key
                or name == protocol.name):
            continue
        done = set(json.loads(tags.get(T.eval_tag(name, "benchmarks"), "[]")))
        if not set(benchmarks) <= done:
            continue
        try:
            scores = {b: {m: metrics[M.eval_metric(name, b, m)]
                          for m in protocol.metric_names(b)} for b in benchmarks}
            average = {m: metrics[M.eval_avg(name, m)] for m in ("acc", "exact_match")}
        except KeyError:  # a metric is missing: evaluate rather than copy half of it
            continue
        outcomes = _logged_outcomes(tracker, run_id, name)
        if outcomes is None:
            continue
        import pyarrow as pa
        import pyarrow.compute as pc

        picked = outcomes.filter(pc.is_in(outcomes["benchmark"], value_set=pa.array(benchmarks)))
        return name, EvalOutcome(scores, average, seconds=0.0,
                                 lm_eval_version=tags.get(T.eval_tag(name, "lm_eval"), ""),
                                 outcomes=picked)
    return None


def _logged_outcomes(tracker: Tracker, run_id: str, protocol: str) -> Any:
    """The outcomes table the run logged for `protocol` (a pyarrow Table), or None."""
    import pyarrow.parquet as pq

    folder = A.folder(protocol)
    listed = {f.path for f in tracker.client.list_artifacts(run_id, folder)}
    if A.outcomes(protocol) not in listed:
        return None
    with tempfile.TemporaryDirectory(prefix="hacrl-outcomes-") as tmp:
        path = tracker.client.download_artifacts(run_id, A.outcomes(protocol), tmp)
        return pq.read_table(path)



@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ for the block; each name's previous value (or absence) after."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in before.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def _evaluate_one(cfg: DictConfig, model_path: str, tracker: Tracker, run_id: str, step: int,
                  protocol: Protocol, benchmarks: list[str]) -> tuple[EvalResult, EvalOutcome]:
    files = data_files(cfg, benchmarks)
    backend = Backend.from_config(cfg.eval, device=str(cfg.engine.get("device", "cpu")))
    # the task's utils read these (they also serve users of the lm_eval CLI); set for this
    # evaluation only, so a later job in the same process sees its own settings or none
    verify_env = {"HACRL_VERIFY_TIMEOUT_S": str(cfg.verify.timeout_s),
                  "HACRL_VERIFY_WORKERS": str(cfg.verify.workers)}
    with tempfile.TemporaryDirectory(prefix="hacrl-eval-") as tmp, _environment(verify_env):
        work = Path(tmp)
        outcome = run_lm_eval(model_path, benchmarks, files, protocol, backend, work,
                              seed=int(cfg.seed))
        _log(cfg, tracker, run_id, step, model_path, protocol, benchmarks, outcome, work,
             backend, files)
    result = EvalResult(run_id, protocol, flat_metrics(protocol, outcome), seconds=outcome.seconds)
    return result, outcome


def _log(cfg: DictConfig, tracker: Tracker, run_id: str, step: int, model_path: str,
         protocol: Protocol, benchmarks: list[str], outcome: EvalOutcome, work: Path | None,
         backend: Backend | None = None, files: dict[str, Path] | None = None) -> None:
    """Artifacts (when `work` holds them; the outcomes table always), metrics, then tags.

    The tags go last: they mark the evaluation as logged (`already_logged`), so a kill before
    them leaves it to be done again rather than logged without its artifacts. The outcomes
    are checked against the scores before anything is logged (a mismatch is a bug).
    """
    folder = A.folder(protocol.name)
    if outcome.outcomes is not None:
        from hacrl.evaluation.outcome_table import write_outcomes

        samples = {b: protocol.sampling_for(b).samples for b in outcome.metrics}
        with tempfile.TemporaryDirectory(prefix="hacrl-outcomes-") as tmp:
            path = write_outcomes(outcome.outcomes, outcome.metrics, samples,
                                  Path(tmp) / A.OUTCOMES_FILE)
            tracker.log_artifact(run_id, path, folder)
    if work is not None:
        assert backend is not None and files is not None
        (work / A.PROTOCOL_FILE).write_text(json.dumps(
            {"protocol": protocol.to_dict(), "key": protocol.key, "backend": backend.name,
             "model_args": backend.model_args(model_path, protocol, int(cfg.seed)),
             "benchmarks": benchmarks, "data_files": {b: str(p) for b, p in files.items()},
             "lm_eval_version": outcome.lm_eval_version, "step": step}, indent=1, default=str))
        (work / A.SCORES_FILE).write_text(json.dumps(
            {"metrics": outcome.metrics, "average": outcome.average}, indent=1))
        write_samples(outcome, work / A.SAMPLES)
        for item in (A.PROTOCOL_FILE, A.SCORES_FILE):
            tracker.log_artifact(run_id, work / item, folder)
        tracker.log_artifacts(run_id, work / A.TASKS, f"{folder}/{A.TASKS}")
        tracker.log_artifacts(run_id, work / A.SAMPLES, f"{folder}/{A.SAMPLES}")
    flat = flat_metrics(protocol, outcome)
    tracker.log_metrics(run_id, {**flat, M.eval_seconds(protocol.name): outcome.seconds}, step)
    record = {"key": protocol.key, "benchmarks": json.dumps(benchmarks),
              "protocol": json.dumps(protocol.to_dict(), sort_keys=True),
              "backend": str(cfg.eval.backend), "model_path": model_path,
              "lm_eval": outcome.lm_eval_version, "step": str(step)}
    tracker.set_tags(run_id, {T.eval_tag(protocol.name, k): v for k, v in record.items()})


def flat_metrics(protocol: Protocol, outcome: EvalOutcome) -> dict[str, float]:
    flat = {M.eval_metric(protocol.name, b, m): v for b, got in outcome.metrics.items()
            for m, v in got.items()}
    flat.update({M.eval_avg(protocol.name, m): v for m, v in outcome.average.items()})
    return flat


# --- targets of `hacrl eval` -------------------------------------------------------------------

@dataclass
class Target:
    """What to evaluate: a model directory, the run that gets the scores, the step it stands at."""

    model_path: str
    run_id: str
    step: int
    label: str


def latest_checkpoint(run_dir: Path, model: str) -> tuple[int, Path] | None:
    """The newest complete checkpoint of `model` under a job's run directory, its files checked
    (against the checkpoint's record, or their headers for checkpoints of an older hacrl). A
    damaged one is an error, not a reason to evaluate an older model in its place."""
    from hacrl.checkpoint import agent_weights, complete, damaged_weights, has_record, verify
    from hacrl.core.errors import CheckpointError

    found = []
    for team in RunDir(run_dir).teams():
        for step, step_dir in complete(team.ckpt):
            weights = agent_weights(step_dir, model)
            if not (weights / "config.json").is_file():
                continue
            try:
                if has_record(step_dir):
                    verify(step_dir)  # a record of this hacrl: sizes and hashes
                elif (damage := damaged_weights(weights)) is not None:
                    raise CheckpointError(damage)
            except (CheckpointError, OSError) as err:
                raise CheckpointError(
                    f"checkpoint {step_dir} cannot be evaluated: {err}; delete "
                    f"{team.done} and rerun the job: it resumes from the "
                    "checkpoint before and trains the last steps again") from err
            found.append((step, weights))
            break
    return max(found) if found else None


def target_from_run(tracker: Tracker, run_id: str) -> Target:
    """An agent run of a training job: its latest checkpoint (or its base model at step 0)."""
    from hacrl.core.errors import ConfigError

    try:
        run = tracker.client.get_run(run_id)
    except Exception:
        raise ConfigError(f"--run {run_id}: no such run in {tracker.uri}") from None
    tags = run.data.tags
    model, run_dir = tags.get(T.MODEL), tags.get(T.RUN_DIR)
    if tags.get(T.KIND) not in (T.AGENT, T.EVAL) or not model:
        raise ConfigError(f"--run {run_id}: not an agent run (tags.{T.KIND}="
                          f"{tags.get(T.KIND)}); pass one of the job's agent runs")
    if tags.get(T.MODEL_PATH):  # a base/checkpoint evaluation run
        return Target(tags[T.MODEL_PATH], run_id, int(tags.get(T.STEP, "0")), model)
    found = latest_checkpoint(Path(run_dir or ""), model)
    if found is None:
        raise ConfigError(f"--run {run_id}: no complete checkpoint of {model} under {run_dir}; "
                          "train it first (the same `hacrl train` command resumes)")
    step, path = found
    return Target(str(path), run_id, step, model)


def standalone_run(tracker: Tracker, cfg: DictConfig, label: str, model_path: str, method: str,
                   step: int = 0) -> str:
    """The run holding a model's own evaluations (found again by model path, scale and zoo
    draw: a zoo rebuilt in place with another seed holds other models at the same paths)."""
    from hacrl.config import zoo_seed

    seed = zoo_seed(cfg)  # None: a scale without a zoo
    draw = str(seed or 0)
    for run in tracker.model_evaluations(model_path, str(cfg.scale.name), draw):
        return str(run.info.run_id)
    tags = {**standard_tags("hacrl eval"), T.KIND: T.EVAL, T.METHOD: method, T.MODEL: label,
            T.SCALE: str(cfg.scale.name), T.SEED: str(cfg.seed), T.MODEL_PATH: model_path,
            T.STEP: str(step)}
    if seed is not None:
        tags[T.ZOO_SEED] = draw
    run_id = tracker.start_run(T.agent_run_name(method, label), tags)
    return run_id  # left RUNNING: the caller ends it FINISHED or FAILED after evaluating


def target_from_checkpoint(tracker: Tracker, cfg: DictConfig, path: Path) -> Target:
    """A model directory; inside a job's run directory its scores go to that agent's run."""
    from hacrl.core.errors import ConfigError

    path = path.expanduser().resolve()
    if not (path / "config.json").is_file() and (path / "model" / "config.json").is_file():
        path = path / "model"  # a job checkpoint's agent folder: weights sit in model/
    if not (path / "config.json").is_file():
        raise ConfigError(f"--checkpoint {path}: no config.json there; pass a model directory "
                          "(e.g. <run dir>/team-0/ckpt/step_000040/<agent>)")
    agent = path.parent.name if path.name == "model" else path.name
    step_dir = path.parent.parent if path.name == "model" else path.parent
    if step_dir.name.startswith("step_") and step_dir.parent.name == "ckpt":
        run_dir = step_dir.parent.parent.parent
        step = int(step_dir.name.removeprefix("step_"))
        query = T.where({T.RUN_DIR: str(run_dir), T.MODEL: agent, T.KIND: T.AGENT}, "FINISHED")
        runs = tracker.find_runs(query)
        if runs:
            return Target(str(path), str(runs[0].info.run_id), step, agent)
        return Target(str(path), standalone_run(tracker, cfg, agent, str(path), "checkpoint",
                                                step), step, agent)
    return Target(str(path), standalone_run(tracker, cfg, agent, str(path), "checkpoint"), 0,
                  agent)


def target_from_model(tracker: Tracker, cfg: DictConfig, name: str, model_path: str) -> Target:
    """A catalog model as it is before any training (Table 1's `base` rows)."""
    return Target(model_path, standalone_run(tracker, cfg, name, model_path, "base"), 0, name)


def describe(result: EvalResult) -> str:
    """A small text table of one evaluation's scores."""
    prefix = M.eval_prefix(result.protocol.name) + "/"
    rows: dict[str, dict[str, float]] = {}
    for key, value in result.metrics.items():
        if key.startswith(prefix) and key.count("/") == 3:
            _, _, bench, metric = key.split("/")
            rows.setdefault(bench, {})[metric] = value
    order = sorted(rows, key=lambda b: (b == "avg", b))
    lines = [f"{'benchmark':<16} {'acc':>7} {'exact':>7}  other"]
    for bench in order:
        got = rows[bench]
        other = " ".join(f"{m}={v:.3f}" for m, v in sorted(got.items())
                         if m not in ("acc", "exact_match", "time_s"))
        lines.append(f"{bench:<16} {got.get('acc', float('nan')):>7.3f} "
                     f"{got.get('exact_match', float('nan')):>7.3f}  {other}")
    return "\n".join(lines)
