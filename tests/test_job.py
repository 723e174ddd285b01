"""`run_job` end to end on the micro zoo into a real MLflow sqlite store: runs, tags, params,
metric histories, skip / force, SIGKILL and resume, determinism, failure."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hacrl.config import compose, validate
from hacrl.engines.local import LocalEngine
from hacrl.job import run_job

REPO = Path(__file__).resolve().parents[1]
AGENTS = ["qwen3-1.7b-base", "qwen3-4b-base"]  # pair=size, the default
VAL = "val/tiny_amc23/acc"
# where the micro models score (conftest's micro_zoo): rewards, losses, capabilities and accuracies
# that vary, so that jobs compared value for value (resumed vs straight, seed vs seed) can differ
SCORING = ("task.train_split=tiny_gsm8k", "validation.benchmark=tiny_gsm8k")
SCORING_VAL = "val/tiny_gsm8k/acc"
TRAINING = ("reward/mean", "loss/total", "grad_norm")  # every method's per-step curves


def _client(root: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")


def _job_runs(client: MlflowClient) -> list:
    exp = client.get_experiment_by_name("hacrl-tiny")  # an experiment per scale
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], "tags.`hacrl.kind` = 'job'")
    return sorted(runs, key=lambda r: r.info.start_time)


def _children(client: MlflowClient, run_id: str) -> dict[str, object]:
    exp = client.get_experiment_by_name("hacrl-tiny")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{run_id}'")
    return {r.data.tags["model"]: r for r in runs}


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _curves(client: MlflowClient, run) -> dict[str, list[tuple[int, float]]]:
    """All metric histories of a run except wall-clock and memory ones."""
    return {key: _history(client, run.info.run_id, key) for key in run.data.metrics
            if not key.startswith(("time/", "memory/"))}


def _spec(root: Path, tiny_job: list[str], *overrides: str):
    return validate(compose([*tiny_job, f"output_root={root}", *overrides]))


def _git_head() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO / "hacrl", capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


@pytest.mark.slow
def test_run_job_end_to_end(job_env, tmp_path, tiny_job, monkeypatch):
    root = tmp_path / "out"  # no store yet: the job creates sqlite:///<output_root>/mlflow.db
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    spec = _spec(root, tiny_job)
    summary = run_job(spec, progress=False)
    assert list(cwd.iterdir()) == []  # artifacts live next to the store, not in ./mlruns
    assert summary["status"] == "FINISHED"
    assert (root / "mlflow.db").is_file()

    client = _client(root)
    (job,) = _job_runs(client)
    assert job.info.run_id == summary["job_run_id"]
    assert job.info.status == "FINISHED"
    tags = job.data.tags
    expected = {"pair": "qwen3-1.7b-base+qwen3-4b-base", "setting": "size", "method": "hacpo",
                "seed": "0", "scale": "tiny", "engine": "local", "profile": "as_run",
                "config_hash": spec.config_hash, "git_commit": _git_head(), "hacrl.kind": "job"}
    assert {k: tags.get(k) for k in expected} == expected
    params = job.data.params
    assert params["train.steps"] == "2" and params["train.prompts_per_step"] == "4"
    assert params["method.name"] == "hacpo" and params["algo.alpha"] == "1.0"
    assert params["algo.cross_clip_lower"] == "0.8" and params["seed"] == "0"
    assert "time/wall_s" in job.data.metrics
    assert "config.yaml" in {a.path for a in client.list_artifacts(job.info.run_id)}
    # named for the runs list; the training config as params, the catalogs left to config.yaml
    assert job.info.run_name == "hacpo · qwen3-1.7b-base+qwen3-4b-base · seed 0"
    assert params["models.qwen3-4b-base.tiny"] == "qwen3-4b-base"
    assert not [k for k in params if k.startswith(("models.qwen3-8b", "data.sources", "cell.",
                                                   "output_root", "eval.protocols.ablation"))]
    assert "eval.protocols.main.max_new_tokens" in params and len(params) < 120
    # MLflow's own source tags, and the datasets the job read with their sha256
    assert tags["mlflow.source.name"] == "hacrl train" and tags["mlflow.user"]
    if _git_head() != "unknown":
        assert tags["mlflow.source.git.commit"] == _git_head()
    inputs = {(d.dataset.name, d.tags[0].value): d.dataset for d in job.inputs.dataset_inputs}
    assert set(inputs) == {("train", "training"), ("tiny_amc23", "validation"),
                           ("tiny_gsm8k", "evaluation"), ("tiny_aime2025", "evaluation")}
    gsm8k = inputs[("tiny_gsm8k", "evaluation")]
    sha = json.loads(gsm8k.profile)["sha256"]
    assert gsm8k.digest == sha[:32]
    file = Path(json.loads(gsm8k.source)["uri"].removeprefix("file://"))
    assert sha == hashlib.sha256(file.read_bytes()).hexdigest()
    assert json.loads(inputs[("train", "training")].source)["uri"] == "hacrl.data.arith:train"

    kids = _children(client, job.info.run_id)
    assert sorted(kids) == AGENTS
    assert summary["agent_run_ids"] == {name: run.info.run_id for name, run in kids.items()}
    for name, run in kids.items():
        other = AGENTS[1 - AGENTS.index(name)]
        run = client.get_run(run.info.run_id)
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == job.info.run_id
        assert {k: run.data.tags.get(k) for k in ("pair", "method", "seed", "config_hash")} == {
            k: expected[k] for k in ("pair", "method", "seed", "config_hash")}
        assert run.data.params["train.steps"] == "2"
        for key in ["reward/mean", "capability/P", f"omega/{other}", "loss/total", "grad_norm",
                    "clip/lower_bound", "ratio/s_homo_mean", "ratio/s_hete_mean", "tokens/own",
                    "response/length_mean", "time/step_s", "memory/peak_rss_gb"]:
            assert [s for s, _ in _history(client, run.info.run_id, key)] == [1, 2], key
        val = _history(client, run.info.run_id, VAL)
        assert [s for s, _ in val] == [0, 1, 2]
        assert all(0.0 <= v <= 1.0 for _, v in val)
        final = {k: _history(client, run.info.run_id, f"eval/main/{k}/acc")
                 for k in ("tiny_gsm8k", "tiny_aime2025", "avg")}
        assert all([s for s, _ in h] == [2] for h in final.values())
        assert final["avg"][0][1] == pytest.approx((final["tiny_gsm8k"][0][1]
                                                    + final["tiny_aime2025"][0][1]) / 2)
        assert summary["teams"][0]["final"][name]["eval/main/avg/acc"] == pytest.approx(
            final["avg"][0][1])
        # ... and on the job run, so its row in the runs list is a results row
        assert run.info.run_name == f"hacpo · {name}"
        assert job.data.metrics[f"avg/{name}"] == pytest.approx(final["avg"][0][1])
        assert job.data.metrics[f"acc/tiny_gsm8k/{name}"] == pytest.approx(
            final["tiny_gsm8k"][0][1])
        # the evaluation ran through lm-eval with the recorded protocol, every response logged
        assert [s for s, _ in _history(client, run.info.run_id, "eval/main/tiny_aime2025/pass_at_4")
                ] == [2]
        assert run.data.tags["hacrl.eval.main.key"] and run.data.tags["hacrl.eval.main.backend"] == "hf"
        assert json.loads(run.data.tags["hacrl.eval.main.protocol"])["sampled"]["aime2025"][
            "samples"] == 4  # scale.eval_samples
        samples = {a.path for a in client.list_artifacts(run.info.run_id, "eval/main/samples")}
        assert samples == {"eval/main/samples/tiny_gsm8k.jsonl.gz",
                           "eval/main/samples/tiny_aime2025.jsonl.gz"}
        assert "eval/main/outcomes.parquet" in {
            a.path for a in client.list_artifacts(run.info.run_id, "eval/main")}
        for key in run.data.metrics:
            assert "@" not in key and "%" not in key

    directory = root / "runs" / f"{spec.config_hash}-hacpo"
    assert summary["run_dir"] == str(directory)
    assert json.loads((directory / "team-0" / "DONE.json").read_text())["agents"] == AGENTS
    kept = sorted((directory / "team-0" / "ckpt").glob("step_*"), reverse=True)
    ckpt = kept[0]  # the newest, and at most one before it (the fallback)
    assert ckpt.name == "step_000002" and len(kept) <= 2
    assert json.loads((ckpt / "COMPLETE").read_text())["step"] == 2
    for name in AGENTS:
        assert (ckpt / name / "optimizer.pt").is_file()
        assert (ckpt / name / "model" / "config.json").is_file()


@pytest.mark.slow
def test_finished_job_is_skipped_unless_forced(job_env, new_output_root, tiny_job, capsys):
    root = new_output_root()
    first = run_job(_spec(root, tiny_job), progress=False)
    assert first["status"] == "FINISHED"
    again = run_job(_spec(root, tiny_job), progress=False)
    assert again["skipped"] is True
    assert "already finished" in capsys.readouterr().err
    client = _client(root)
    assert [r.info.run_id for r in _job_runs(client)] == [first["job_run_id"]]

    forced = run_job(_spec(root, tiny_job, "force=true"), progress=False)
    assert forced["status"] == "FINISHED" and forced["job_run_id"] != first["job_run_id"]
    runs = _job_runs(client)
    assert [r.info.run_id for r in runs] == [first["job_run_id"], forced["job_run_id"]]
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert len({r.data.tags["config_hash"] for r in runs}) == 1
    assert len(_children(client, forced["job_run_id"])) == 2


@pytest.mark.slow
def test_single_agent_method_logs_one_child_per_agent(job_env, new_output_root, tiny_job):
    root = new_output_root()
    summary = run_job(_spec(root, tiny_job, "method=gspo", "pair=model_small"), progress=False)
    client = _client(root)
    (job,) = _job_runs(client)
    kids = _children(client, job.info.run_id)
    assert sorted(kids) == ["llama3.2-1b-instruct", "qwen3-1.7b-base"]
    assert len(summary["teams"]) == 2
    for run in kids.values():
        history = _history(client, run.info.run_id, "reward/mean")
        assert [s for s, _ in history] == [1, 2]
        assert "ratio/s_hete_mean" not in client.get_run(run.info.run_id).data.metrics


@pytest.mark.slow
def test_same_seed_same_metrics_other_seed_differs(job_env, new_output_root, tiny_job,
                                                   assert_varies):
    def curves(root: Path, *overrides: str) -> dict[str, dict]:
        summary = run_job(_spec(root, tiny_job, *SCORING, *overrides), progress=False)
        client = _client(root)
        return {name: _curves(client, client.get_run(run_id))
                for name, run_id in summary["agent_run_ids"].items()}

    a = curves(new_output_root("a"))
    b = curves(new_output_root("b"))
    other = curves(new_output_root("c"), "seed=1")
    assert a == b
    assert set(a[AGENTS[0]]) >= {*TRAINING, "capability/P", SCORING_VAL}
    for name in AGENTS:  # the real verifier: updates are not all zero
        for key in (*TRAINING, "capability/P"):
            assert_varies(f"{name} {key}", a[name][key])
        assert any(v > 0 for _, v in a[name]["reward/mean"])
        assert (a[name]["reward/mean"] != other[name]["reward/mean"]
                or a[name]["loss/total"] != other[name]["loss/total"])


@pytest.mark.slow
def test_engine_error_mid_step_ends_failed(job_env, new_output_root, tiny_job, monkeypatch):
    root = new_output_root()

    def explode(self, views, batch, loss_fn):
        raise RuntimeError("engine exploded")

    original = LocalEngine.train_minibatch
    monkeypatch.setattr(LocalEngine, "train_minibatch", explode)
    with pytest.raises(RuntimeError, match="engine exploded"):
        run_job(_spec(root, tiny_job), progress=False)
    client = _client(root)
    (job,) = _job_runs(client)
    assert job.info.status == "FAILED"
    kids = _children(client, job.info.run_id)
    assert sorted(kids) == AGENTS
    assert {run.info.status for run in kids.values()} == {"FAILED"}
    assert not list(root.glob("runs/*/team-0/DONE.json"))

    # the failed job is not "finished": running it again trains it
    monkeypatch.setattr(LocalEngine, "train_minibatch", original)
    summary = run_job(_spec(root, tiny_job), progress=False)
    assert summary["status"] == "FINISHED"
    assert [r.info.status for r in _job_runs(client)] == ["FAILED", "FINISHED"]


@pytest.mark.slow
def test_sigkill_then_resume(job_env, new_output_root, tiny_job, hacrl_cmd, cli_env, tmp_path,
                             assert_varies):
    root = new_output_root()
    steps = 6
    overrides = [*tiny_job, *SCORING, f"train.steps={steps}", "train.save_every=2"]
    args = [*hacrl_cmd, "train", *overrides]
    env = cli_env(root)
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            # no clock limit of its own: pytest-timeout ends a run that never checkpoints
            while not list(root.glob("runs/*/team-0/ckpt/step_*/COMPLETE")):
                assert first.poll() is None, (tmp_path / "first.log").read_text()
                time.sleep(0.01)
            os.kill(first.pid, signal.SIGKILL)
        finally:
            first.kill()
            first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL, "the first run finished before it was killed"
    assert not list(root.glob("runs/*/team-0/DONE.json"))

    second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]

    client = _client(root)
    killed, resumed = _job_runs(client)
    assert killed.info.status == "KILLED"
    assert resumed.info.status == "FINISHED"
    assert killed.data.tags["config_hash"] == resumed.data.tags["config_hash"]
    old_kids = _children(client, killed.info.run_id)
    new_kids = _children(client, resumed.info.run_id)
    assert sorted(new_kids) == AGENTS
    assert {r.info.status for r in old_kids.values()} == {"KILLED"}
    resumed_at = {int(r.data.tags["hacrl.resumed_at_step"]) for r in new_kids.values()}
    assert len(resumed_at) == 1 and 0 < (at := resumed_at.pop()) < steps

    # the same job without interruption, in this process
    straight_root = new_output_root("straight")
    summary = run_job(validate(compose([*overrides, f"output_root={straight_root}"])),
                      progress=False)
    straight = _client(straight_root)
    validations = []
    for name in AGENTS:
        run_id = new_kids[name].info.run_id
        for key in (*TRAINING, "capability/P", SCORING_VAL):
            history = _history(client, run_id, key)
            assert [s for s, _ in history] == list(range(key != SCORING_VAL, steps + 1)), key
            # copied history + resumed steps = the uninterrupted run, value for value
            assert history == _history(straight, summary["agent_run_ids"][name], key), key
            if key != SCORING_VAL:  # the resumed steps' values vary: a wrong state would show
                assert_varies(f"{name} {key} after the resume", [h for h in history if h[0] > at])
        validations.append(_history(client, run_id, SCORING_VAL))
        assert [s for s, _ in _history(client, run_id, "eval/main/avg/acc")] == [steps]
    assert_varies(SCORING_VAL, *validations)  # greedy, so a few updates may not change it


def test_resumed_multi_team_job_keeps_the_finished_teams_history(job_env, new_output_root,
                                                                  tiny_job, monkeypatch,
                                                                  assert_varies):
    """gspo on a pair trains two teams one after the other; the job dies in the second team."""
    root = new_output_root()
    overrides = ["method=gspo", "pair=model_small", "train.steps=4", "train.save_every=2",
                 *SCORING]
    original = LocalEngine.train_minibatch
    calls = {"n": 0}

    def dies_in_step_3_of_llama(self, views, batch, loss_fn):
        if "llama" in self.model_path:
            calls["n"] += 1
            if calls["n"] > 4:  # 2 updates per step
                raise RuntimeError("node lost")
        return original(self, views, batch, loss_fn)

    monkeypatch.setattr(LocalEngine, "train_minibatch", dies_in_step_3_of_llama)
    with pytest.raises(RuntimeError, match="node lost"):
        run_job(_spec(root, tiny_job, *overrides), progress=False)
    monkeypatch.setattr(LocalEngine, "train_minibatch", original)
    assert list(root.glob("runs/*/team-0/DONE.json"))
    assert list(root.glob("runs/*/team-1/ckpt/step_000002/COMPLETE"))

    summary = run_job(_spec(root, tiny_job, *overrides), progress=False)
    assert summary["status"] == "FINISHED"
    client = _client(root)
    failed, resumed = _job_runs(client)
    assert failed.info.status == "FAILED" and resumed.info.run_id == summary["job_run_id"]
    kids = _children(client, resumed.info.run_id)
    assert kids["llama3.2-1b-instruct"].data.tags["hacrl.resumed_at_step"] == "2"
    for name, run in kids.items():
        assert [s for s, _ in _history(client, run.info.run_id, "reward/mean")] == [1, 2, 3, 4], name
        assert [s for s, _ in _history(client, run.info.run_id, "eval/main/avg/acc")] == [4], name
        assert [s for s, _ in _history(client, run.info.run_id, SCORING_VAL)] == [0, 1, 2, 3, 4], name

    # the finished team's history and the resumed team's steps = an uninterrupted job's
    straight_root = new_output_root("straight")
    straight = run_job(_spec(straight_root, tiny_job, *overrides), progress=False)
    validations = []
    for name, run in kids.items():
        for key in (*TRAINING, SCORING_VAL):
            history = _history(client, run.info.run_id, key)
            assert history == _history(_client(straight_root), straight["agent_run_ids"][name],
                                       key), (name, key)
            if key != SCORING_VAL:
                assert_varies(f"{name} {key}", history)
        validations.append(_history(client, run.info.run_id, SCORING_VAL))
    assert_varies(SCORING_VAL, *validations)


def test_a_job_with_a_report_hook_tells_its_phase_and_writes_lines(job_env, new_output_root,
                                                                    tiny_job, capsys):
    """What a sweep cell's job does: its phase and step to the hook (the cell's state file),
    and readable lines on stdout (the cell's log) instead of a progress bar."""
    seen: list[dict] = []
    run_job(_spec(new_output_root(), tiny_job), report=seen.append)
    assert seen == [{"phase": "training", "step": 0, "steps": 2},
                    {"phase": "training", "step": 1, "steps": 2},
                    {"phase": "training", "step": 2, "steps": 2}, {"phase": "evaluating"}]
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert any(" validation at step 0: val/tiny_amc23/acc qwen3-1.7b-base " in ln for ln in lines)
    assert any(" step 2/2  reward qwen3-1.7b-base " in ln and ln.endswith(" s)") for ln in lines)
    assert any(ln.endswith("evaluating qwen3-1.7b-base, qwen3-4b-base") for ln in lines)
    assert "step/s" not in captured.err and "hacpo:" not in captured.err  # no bar
