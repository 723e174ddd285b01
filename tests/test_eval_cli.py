"""`hacrl eval` on micro models: base models, agent runs and checkpoints, skip and force."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hacrl.cli import main
from hacrl.config import compose, validate
from hacrl.job import run_job

BENCH = "eval.benchmarks=[tiny_gsm8k,tiny_aime2025]"
LIMIT = "eval.protocols.main.limit=30"  # the first 30 problems of each


def _client(root: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{root / 'mlflow.db'}")


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def _jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _runs(client: MlflowClient, query: str = "") -> list:
    ids = [e.experiment_id for e in client.search_experiments()]
    return list(client.search_runs(ids, query))


def test_eval_base_model_logs_scores_protocol_and_samples(job_env, new_output_root, capsys):
    root = new_output_root()
    # --limit 30: as the override LIMIT, set on the composed config (no second composition)
    args = ["eval", "--model", "qwen3-4b-base", "--limit", "30", f"output_root={root}", BENCH]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "protocol main" in out and "tiny_aime2025" in out
    # the verifier settings the task files read are set for the evaluation only
    assert not [name for name in os.environ if name.startswith("HACRL_VERIFY")]
    client = _client(root)
    (run,) = _runs(client)
    tags, metrics = run.data.tags, run.data.metrics
    assert run.info.status == "FINISHED"
    assert (tags["hacrl.kind"], tags["method"], tags["model"], tags["scale"], tags["seed"]) == (
        "eval", "base", "qwen3-4b-base", "tiny", "0")
    for key in ("tiny_gsm8k/acc", "tiny_gsm8k/exact_match", "tiny_aime2025/acc",
                "tiny_aime2025/avg_at_4", "tiny_aime2025/pass_at_4", "avg/acc"):
        assert 0.0 <= metrics[f"eval/main/{key}"] <= 1.0, key
    assert metrics["eval/main/avg/acc"] == pytest.approx(
        (metrics["eval/main/tiny_gsm8k/acc"] + metrics["eval/main/tiny_aime2025/acc"]) / 2)
    assert metrics["eval/main/tiny_aime2025/pass_at_4"] >= metrics["eval/main/tiny_aime2025/acc"]
    protocol = json.loads(tags["hacrl.eval.main.protocol"])
    assert protocol["max_new_tokens"] == 32 and protocol["sampled"]["aime2025"]["samples"] == 4
    assert protocol["limit"] == 30
    assert json.loads(tags["hacrl.eval.main.benchmarks"]) == ["tiny_gsm8k", "tiny_aime2025"]

    folder = Path(client.download_artifacts(run.info.run_id, "eval/main", str(root / "dl")))
    assert json.loads((folder / "protocol.json").read_text())["key"] == tags["hacrl.eval.main.key"]
    assert {p.name for p in (folder / "tasks").iterdir()} >= {
        "hacrl_tiny_gsm8k.yaml", "hacrl_tiny_aime2025.yaml", "hacrl_suite.yaml", "utils.py"}
    aime = _jsonl_gz(folder / "samples" / "tiny_aime2025.jsonl.gz")
    assert len(aime) == 30 and all(len(r["responses"]) == len(r["grades"]) == 4 for r in aime)
    gsm = _jsonl_gz(folder / "samples" / "tiny_gsm8k.jsonl.gz")
    assert len(gsm) == 30 and gsm[0]["prompt"].startswith("<|im_start|>user\nWhat is")
    # the per-sample grades add up to the logged accuracy
    assert sum(g["correct"] for r in gsm for g in r["grades"]) / 30 == pytest.approx(
        metrics["eval/main/tiny_gsm8k/acc"])

    # again: already logged, nothing re-evaluated; --force evaluates again into the same run
    assert main(args) == 0
    assert "already logged" in capsys.readouterr().out
    assert len(_history(client, run.info.run_id, "eval/main/avg/acc")) == 1
    assert main([*args, "--force"]) == 0
    assert len(_history(client, run.info.run_id, "eval/main/avg/acc")) == 2
    # another protocol is another evaluation of the same model, in the same run
    assert main([*args, "eval.use=[ablation]", "scale.eval_tokens.ablation=16"]) == 0
    (run,) = _runs(client)
    assert "eval/ablation/avg/acc" in run.data.metrics
    assert run.data.tags["hacrl.eval.ablation.key"] != run.data.tags["hacrl.eval.main.key"]


def test_protocols_with_the_same_settings_share_one_evaluation(job_env, new_output_root, capsys):
    root = new_output_root()
    args = ["eval", "--model", "qwen3-1.7b-base", f"output_root={root}", "eval.use=[main,ablation]",
            "eval.benchmarks=[tiny_gsm8k]"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "protocol ablation" in out and "same settings as main, scores copied" in out
    (run,) = _runs(_client(root))
    m = run.data.metrics
    assert m["eval/ablation/tiny_gsm8k/acc"] == m["eval/main/tiny_gsm8k/acc"]
    assert run.data.tags["hacrl.eval.ablation.key"] == run.data.tags["hacrl.eval.main.key"]


def test_a_protocol_logged_earlier_with_the_same_key_is_copied_not_evaluated_again(
        job_env, new_output_root, capsys, monkeypatch):
    """A sweep cell done for `main` and later asked for `ablation` (the same settings at tiny
    scale): the scores and the outcomes table are copied from the run, lm-eval does not run."""
    import pyarrow.parquet as pq

    from hacrl.evaluation import runner

    root = new_output_root()
    common = ["eval", "--model", "qwen3-1.7b-base", f"output_root={root}",
              "eval.benchmarks=[tiny_gsm8k,tiny_aime2025]", "eval.protocols.main.limit=20",
              "eval.protocols.ablation.limit=20"]
    assert main([*common, "eval.use=[main]"]) == 0
    capsys.readouterr()

    def no_second_evaluation(*args: object, **kwargs: object) -> None:
        raise AssertionError("lm-eval ran again for a protocol with a logged key")

    monkeypatch.setattr(runner, "run_lm_eval", no_second_evaluation)
    assert main([*common, "eval.use=[main,ablation]"]) == 0
    out = capsys.readouterr().out
    assert "protocol main" in out and "already logged" in out
    assert "protocol ablation" in out and "same settings as main, scores copied" in out
    client = _client(root)
    (run,) = _runs(client)
    m = run.data.metrics
    for key in ("tiny_gsm8k/acc", "tiny_aime2025/avg_at_4", "tiny_aime2025/pass_at_4",
                "avg/acc"):
        assert m[f"eval/ablation/{key}"] == m[f"eval/main/{key}"], key
    tables = [pq.read_table(client.download_artifacts(run.info.run_id,
                                                       f"eval/{p}/outcomes.parquet",
                                                       str(root / f"dl-{p}"))) for p in
              ("main", "ablation")]
    assert tables[0].equals(tables[1]) and tables[0].num_rows == 20 + 20 * 4


def test_eval_agent_run_and_its_checkpoint(job_env, new_output_root, tiny_job, capsys):
    root = new_output_root()
    spec = validate(compose([*tiny_job, f"output_root={root}", "eval.at_end=false",
                             "pair=size"]))
    summary = run_job(spec, progress=False)
    client = _client(root)
    agent_run = summary["agent_run_ids"]["qwen3-4b-base"]
    assert not any(k.startswith("eval/") for k in client.get_run(agent_run).data.metrics)

    assert main(["eval", "--run", agent_run, f"output_root={root}", BENCH]) == 0
    assert "(step 2)" in capsys.readouterr().out
    assert [s for s, _ in _history(client, agent_run, "eval/main/avg/acc")] == [2]
    assert client.get_run(agent_run).data.tags["hacrl.eval.main.model_path"].endswith(
        "step_000002/qwen3-4b-base/model")

    # the same checkpoint given as a folder resolves to the same agent run: already logged
    ckpt = Path(summary["run_dir"]) / "team-0" / "ckpt" / "step_000002" / "qwen3-4b-base"
    assert main(["eval", "--checkpoint", str(ckpt), f"output_root={root}", BENCH]) == 0
    assert "already logged" in capsys.readouterr().out
    assert len(_runs(client, "tags.`hacrl.kind` = 'eval'")) == 0


@pytest.mark.parametrize(("args", "message"), [
    (["eval"], "exactly one of --model"),
    (["eval", "--model", "qwen3-4b-base", "--run", "abc"], "exactly one of --model"),
    (["eval", "--model", "gpt-9"], "agents[0]=gpt-9: not in models/catalog.yaml"),
    (["eval", "--run", "0123456789abcdef"], "--run 0123456789abcdef: no such run"),
    (["eval", "--checkpoint", "/nonexistent/x"], "--checkpoint /nonexistent/x: no config.json"),
    (["eval", "--model", "qwen3-4b-base", "eval.benchmarks=[nope]"], "nope"),
    (["eval", "--model", "qwen3-4b-base", "eval.protocols.main.samples=2"], "temperature 0"),
])
def test_eval_bad_input_is_one_line(job_env, new_output_root, capsys, args, message):
    root = new_output_root()
    assert main([*args, f"output_root={root}"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err


def test_eval_missing_hub_data_names_file_and_command(job_env, new_output_root, capsys,
                                                      tmp_path):
    root = new_output_root()
    code = main(["eval", "--model", "qwen3-4b-base", "scale=paper", f"output_root={root}",
                 f"data.root={tmp_path / 'empty'}", "eval.benchmarks=[math500]"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert str(tmp_path / "empty" / "math500.jsonl") in err and "hacrl data prepare math500" in err
    assert _runs(_client(root)) == []  # nothing was started


def test_the_evaluation_environment_is_restored(monkeypatch):
    from hacrl.evaluation.runner import _environment

    monkeypatch.setenv("HACRL_VERIFY_WORKERS", "7")
    monkeypatch.delenv("HACRL_VERIFY_TIMEOUT_S", raising=False)
    with _environment({"HACRL_VERIFY_WORKERS": "2", "HACRL_VERIFY_TIMEOUT_S": "3.0"}):
        assert (os.environ["HACRL_VERIFY_WORKERS"], os.environ["HACRL_VERIFY_TIMEOUT_S"]) == (
            "2", "3.0")
    assert os.environ["HACRL_VERIFY_WORKERS"] == "7" and "HACRL_VERIFY_TIMEOUT_S" not in os.environ


@pytest.mark.slow
@pytest.mark.parametrize("command", ["eval", "train"], ids=["hacrl-eval", "method-base"])
def test_two_evaluation_only_jobs_of_one_model_log_once(job_env, new_output_root, hacrl_cmd,
                                                        cli_env, tmp_path, command):
    """Two evaluation-only jobs of the same model, both started while the model's evaluation
    lock is held (as by a third job), both wait and say so; released, they take turns: one run
    holds the model's scores, each metric logged once."""
    import fcntl
    import subprocess
    import time

    from hacrl.config import model_path
    from hacrl.core.layout import Layout

    root = new_output_root()
    lock = Layout(root).evaluation_lock(model_path(compose([]), 0, "qwen3-4b-base"))
    lock.parent.mkdir(parents=True, exist_ok=True)
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(held, fcntl.LOCK_EX)
    args = (["eval", "--model", "qwen3-4b-base"] if command == "eval" else
            ["train", "method=base", "agents=[qwen3-4b-base]"])
    logs = [tmp_path / f"job{i}.err" for i in range(2)]
    jobs = [subprocess.Popen([*hacrl_cmd, *args, f"output_root={root}",
                              "eval.benchmarks=[tiny_gsm8k]", LIMIT], env=cli_env(root),
                             stdout=subprocess.DEVNULL, stderr=log.open("w")) for log in logs]
    deadline = time.monotonic() + 300
    while not all("hacrl: waiting for the evaluation of qwen3-4b-base" in log.read_text()
                  for log in logs):
        assert time.monotonic() < deadline and all(job.poll() is None for job in jobs), \
            [log.read_text()[-2000:] for log in logs]
        time.sleep(0.2)
    os.close(held)
    assert [job.wait(timeout=600) for job in jobs] == [0, 0], [log.read_text() for log in logs]
    client = _client(root)
    (run,) = _runs(client, "tags.`hacrl.kind` = 'eval'")
    assert run.info.status == "FINISHED"
    for key in run.data.metrics:
        assert len(client.get_metric_history(run.info.run_id, key)) == 1, key
