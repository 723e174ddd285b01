"""The per-sample outcomes table every evaluation logs (`hacrl eval`, a job's final
evaluation), its check against the logged scores, and the analysis reading it back through a
real MLflow store (`analysis.outcomes`).

The micro models almost never answer right, and all-zero grades would agree with any score;
so evaluation grades here with the lenient stand-in verifier (conftest), which passes about
half of their responses, through the real lm-eval tasks, filter and metrics.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lm_eval.api.model import LM
from mlflow.tracking import MlflowClient

import hacrl.verify
from analysis.outcomes import (
    OutcomesError,
    aligned_problem_means,
    problem_means,
    read_outcomes,
)
from analysis.store import open_store
from hacrl.cli import main
from hacrl.config import compose, validate
from hacrl.config.protocol import Protocol
from hacrl.data import load_rows
from hacrl.evaluation.lmeval import Backend, run_lm_eval
from hacrl.evaluation.outcome_table import OutcomesMismatch, write_outcomes
from hacrl.evaluation.runner import data_files
from hacrl.job import run_job
from hacrl.schema import eval_artifacts as A
from hacrl.schema import tags as T
from hacrl.tracking import Tracker
from hacrl.verify import Grade, extract_answer

BENCH = ["tiny_gsm8k", "tiny_aime2025"]  # greedy, and sampled 4 times at tiny scale (scale.eval_samples)
TYPES = {"benchmark": pa.string(), "problem": pa.string(), "sample": pa.int32(),
         "answer": pa.string(), "correct": pa.int8()}


class LenientVerifier:
    """hacrl.verify's interface with the lenient grade (the real extraction of the answer);
    a job's training rewards come from it too."""

    def __init__(self, grade: Callable[[list[str], list[str]], list[float]]) -> None:
        self.grade = self.rewards = grade

    def grade_many(self, responses: list[str], answers: list[str]) -> list[Grade]:
        scores = self.grade(list(responses), list(answers))
        return [Grade(correct=bool(s), exact_match=False, extracted=extract_answer(r))
                for r, s in zip(responses, scores, strict=True)]


@pytest.fixture
def lenient_eval(monkeypatch: pytest.MonkeyPatch, lenient_grader: Any) -> None:
    # the task's filter (lm_eval_tasks/utils.py) and `tasks.grader` look the verifier up
    monkeypatch.setattr(hacrl.verify, "default_verifier",
                        lambda **_: LenientVerifier(lenient_grader))


def _uri(root: Path) -> str:
    return f"sqlite:///{root / 'mlflow.db'}"


def _logged(client: MlflowClient, run_id: str, protocol: str = "main") -> dict[str, float]:
    prefix = f"eval/{protocol}/"
    return {k.removeprefix(prefix): v for k, v in client.get_run(run_id).data.metrics.items()
            if k.startswith(prefix)}


def _assert_gives_the_scores(table: pd.DataFrame, logged: dict[str, float],
                             k: dict[str, int]) -> None:
    """Per benchmark: k samples per problem, and the means over samples then problems are the
    logged acc (avg@k) and pass@k, bit for bit (k = 1 or 4: every term is exact in binary)."""
    for bench, rows in table.groupby("benchmark"):
        per_problem = rows.groupby("problem")["sample"].apply(sorted)
        assert all(s == list(range(k[bench])) for s in per_problem), bench
        means = problem_means(rows)[bench]
        assert 0.0 < means.mean() < 1.0, bench  # mixed grades: a sum that could disagree
        assert means.mean() == logged[f"{bench}/acc"], bench
        if k[bench] > 1:
            assert means.mean() == logged[f"{bench}/avg_at_{k[bench]}"]
            assert (means > 0).mean() == logged[f"{bench}/pass_at_{k[bench]}"]


def test_eval_logs_outcomes_and_the_analysis_reads_them(job_env, new_output_root, lenient_eval,
                                                        tmp_path):
    root = new_output_root()
    assert main(["eval", "--model", "qwen3-4b-base", f"output_root={root}",
                 f"eval.benchmarks=[{','.join(BENCH)}]", "eval.use=[main,ablation]",
                 "eval.protocols.main.limit=30", "eval.protocols.ablation.limit=30"]) == 0
    client = MlflowClient(_uri(root))
    (run,) = client.search_runs([client.get_experiment_by_name("hacrl-tiny").experiment_id])
    run_id = run.info.run_id
    logged = _logged(client, run_id)

    # the file: columns, types, one row per sample, in lm-eval's document order
    raw = pq.read_table(client.download_artifacts(run_id, A.outcomes("main"), str(tmp_path)))
    assert {f.name: f.type for f in raw.schema} == TYPES
    assert list(raw.schema.names) == list(TYPES)
    frame = raw.to_pandas()
    assert Counter(frame["benchmark"]) == {"tiny_gsm8k": 30, "tiny_aime2025": 30 * 4}
    assert all(p.startswith(f"{b}-") for b, p in zip(frame["benchmark"], frame["problem"],
                                                     strict=True))
    assert set(frame["correct"]) == {0, 1}
    _assert_gives_the_scores(frame, logged, {"tiny_gsm8k": 1, "tiny_aime2025": 4})

    # the verbose samples, gzipped, hold the same answers and grades
    folder = Path(client.download_artifacts(run_id, f"{A.folder('main')}/{A.SAMPLES}",
                                            str(tmp_path / "samples")))
    assert sorted(p.name for p in folder.iterdir()) == [A.samples_file(b) for b in sorted(BENCH)]
    with gzip.open(folder / A.samples_file("tiny_aime2025"), "rt") as f:
        aime = [json.loads(line) for line in f]
    from_samples = [(r["uid"], i, g["extracted"] or "", int(g["correct"]))
                    for r in aime for i, g in enumerate(r["grades"])]
    rows = frame[frame["benchmark"] == "tiny_aime2025"]
    assert from_samples == list(zip(rows["problem"], rows["sample"], rows["answer"],
                                    rows["correct"], strict=True))
    assert (rows["answer"] != "").any()

    # the reader, through the store: a run with no outcomes (an evaluation logged before they
    # existed) is missing; one with an empty table is not missing, it has no rows
    tracker = Tracker(_uri(root), "hacrl-tiny")
    old = tracker.start_run("old", {T.KIND: T.EVAL})
    tracker.log_metrics(old, {"eval/main/tiny_gsm8k/acc": 0.5}, 0)
    empty = tracker.start_run("empty", {T.KIND: T.EVAL})
    write_outcomes(pa.table({n: [] for n in TYPES}, schema=pa.schema(TYPES.items())), {}, {},
                   tmp_path / "empty" / A.OUTCOMES_FILE)
    tracker.log_artifact(empty, tmp_path / "empty" / A.OUTCOMES_FILE, A.folder("main"))
    store = open_store(_uri(root), "hacrl-tiny")
    downloads = _count_downloads(store)
    got = read_outcomes(store, [old, run_id, empty], "main")
    assert (got.found, got.missing) == ([run_id, empty], [old])
    assert list(got.table.columns) == ["run_id", *TYPES]
    assert (got.table["run_id"] == run_id).all()
    assert got.table.drop(columns="run_id").equals(frame)
    assert got.table["correct"].dtype == np.int8 and got.table["sample"].dtype == np.int32
    # a sqlite store's artifacts are local files (file:// URIs): read in place, not copied
    assert downloads == []
    artifacts = Path(urlparse(client.get_run(run_id).info.artifact_uri).path)
    assert store.artifact(run_id, A.outcomes("main")) == artifacts / A.outcomes("main")
    again = read_outcomes(store, [run_id, old], "main")
    assert again.missing == [old] and again.table.equals(got.table)

    # the protocol that shared main's evaluation (same settings) has the same outcomes
    ablation = read_outcomes(store, [run_id], "ablation")
    assert ablation.missing == [] and ablation.table.equals(got.table)
    assert read_outcomes(store, [run_id], "other").missing == [run_id]

    means = problem_means(got.table, run_id)
    assert sorted(means) == sorted(BENCH) and len(means["tiny_aime2025"]) == 30
    ids = sorted(set(rows["problem"]))
    by_id = rows.groupby("problem")["correct"].mean()
    assert means["tiny_aime2025"].tolist() == [by_id[i] for i in ids]


@pytest.mark.slow
def test_outcomes_come_through_a_server_that_serves_the_artifacts(tmp_path):
    """A store behind `mlflow ui` (the server `hacrl ui` starts): the runs' artifacts live at
    `mlflow-artifacts:` URIs, which the reader downloads through the server, once per file."""
    from hacrl.tracking import Tracker

    Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "hacrl-tiny")  # `hacrl ui` serves a store
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "hacrl.cli", "ui", f"output_root={tmp_path}",
                               "--port", str(port)], cwd=tmp_path,
                              env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        uri = f"http://127.0.0.1:{port}"
        _wait_for(uri, server)
        client = MlflowClient(uri)
        run_id = client.create_run(client.create_experiment("served")).info.run_id
        table = pa.table({"benchmark": ["tiny_gsm8k"] * 2, "problem": ["p0", "p1"],
                          "sample": [0, 0], "answer": ["4", ""], "correct": [1, 0]},
                         schema=pa.schema(TYPES.items()))
        pq.write_table(table, tmp_path / A.OUTCOMES_FILE)
        client.log_artifact(run_id, str(tmp_path / A.OUTCOMES_FILE), A.folder("main"))
        client.set_terminated(run_id)
        assert client.get_run(run_id).info.artifact_uri.startswith("mlflow-artifacts:")

        store = open_store(uri, "served")
        downloads = _count_downloads(store)
        got = read_outcomes(store, [run_id], "main")
        assert got.found == [run_id] and downloads == [run_id]
        assert got.table.drop(columns="run_id").equals(table.to_pandas())
        assert read_outcomes(store, [run_id], "main").table.equals(got.table)
        assert downloads == [run_id]  # fetched once per store
        assert read_outcomes(store, [run_id], "other").missing == [run_id]
    finally:
        server.terminate()
        server.wait(timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(uri: str, server: subprocess.Popen[bytes]) -> None:
    """Until the server answers (or ends); pytest-timeout ends a server that never does."""
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        assert server.poll() is None, "the MLflow server ended"
        time.sleep(0.5)


def _count_downloads(store: Any) -> list[str]:
    """The run ids `store` downloads artifacts of, recorded as it goes."""
    calls: list[str] = []
    client = store.client

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(client, name)

        def download_artifacts(self, run_id: str, *args: Any) -> Any:
            calls.append(run_id)
            return client.download_artifacts(run_id, *args)

    store.client = Counting()
    return calls


@pytest.mark.slow
def test_final_evaluation_of_a_job_logs_outcomes(job_env, new_output_root, tiny_job,
                                                 lenient_eval):
    root = new_output_root()
    summary = run_job(validate(compose([*tiny_job, f"output_root={root}"])), progress=False)
    agents = list(summary["agent_run_ids"].values())
    store = open_store(_uri(root), "hacrl-tiny")
    got = read_outcomes(store, [summary["job_run_id"], *agents], "main")
    assert got.missing == [summary["job_run_id"]]  # the job run holds no evaluation
    assert got.found == agents
    client = MlflowClient(_uri(root))
    for run_id in agents:
        rows = got.table[got.table["run_id"] == run_id]
        _assert_gives_the_scores(rows, _logged(client, run_id),
                                 {"tiny_gsm8k": 1, "tiny_aime2025": 4})
    # both agents answered the same problems: one matrix per benchmark, a row per agent
    aligned = aligned_problem_means(got.table, agents)
    assert {b: m.shape for b, m in aligned.items()} == {"tiny_aime2025": (2, 40),
                                                        "tiny_gsm8k": (2, 40)}
    for row, run_id in enumerate(agents):
        assert np.array_equal(aligned["tiny_gsm8k"][row],
                              problem_means(got.table, run_id)["tiny_gsm8k"])


class ScriptedLM(LM):
    """Answers the j-th sample of the i-th problem right when j < i % 4, else `no`: 0, 1, 2 or
    3 right of three samples, and greedy ones right unless i % 4 == 0."""

    def __init__(self, gold: dict[str, str]) -> None:
        super().__init__()
        self.gold = gold
        self.calls: Counter[str] = Counter()

    @property
    def tokenizer_name(self) -> str:
        return "scripted"

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        return "".join(m["content"] for m in chat_history)

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        out = []
        for request in requests:
            uid = request.doc["uid"]
            right = self.calls[uid] < int(uid.rpartition("-")[2]) % 4  # i: the uid's number
            self.calls[uid] += 1
            out.append(f"\\boxed{{{self.gold[uid] if right else 'no'}}}")
        return out

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        raise NotImplementedError

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        raise NotImplementedError


def test_outcomes_check_is_exact_for_three_samples_and_refuses_a_wrong_grade(job_env, tmp_path):
    # k=3: per-problem means are thirds, not exact in binary, so the sum's order matters; the
    # check redoes lm-eval's arithmetic in its order and must agree bit for bit (real verifier)
    cfg = compose(["eval.protocols.main.sampled.aime2025.samples=3"])
    protocol = Protocol.in_use(cfg.eval)[0]
    gold = {r["uid"]: r["answer"] for b in BENCH for r in load_rows(cfg.data, b)}
    outcome = run_lm_eval("scripted", BENCH, data_files(cfg, BENCH), protocol, Backend(),
                          tmp_path, lm=ScriptedLM(gold))
    assert outcome.outcomes is not None
    k = {"tiny_gsm8k": 1, "tiny_aime2025": 3}
    path = write_outcomes(outcome.outcomes, outcome.metrics, k, tmp_path / "o.parquet")
    table = pq.read_table(path).to_pandas()
    aime = table[table["benchmark"] == "tiny_aime2025"]
    # problems 0..199 get 0, 1, 2, 3, 0, ... right: 50 * (0 + 1 + 2 + 3) = 300 of 600
    assert outcome.metrics["tiny_aime2025"]["acc"] == pytest.approx(300 / 600)
    assert aime.groupby("problem", sort=False)["correct"].sum().tolist() == [
        i % 4 for i in range(200)]
    gsm = table[table["benchmark"] == "tiny_gsm8k"]
    assert gsm["correct"].sum() == 900 - 225 and (gsm["answer"][gsm["correct"] == 0] == "no").all()
    assert problem_means(table)["tiny_aime2025"].mean() == pytest.approx(
        outcome.metrics["tiny_aime2025"]["acc"], rel=1e-12)

    # one grade flipped, a sample dropped, another k: each is refused, naming the benchmark
    correct = table["correct"].to_numpy().copy()
    correct[0] ^= 1  # the first row: problem 0 of tiny_gsm8k
    flipped = outcome.outcomes.set_column(4, "correct", pa.array(correct, pa.int8()))
    with pytest.raises(OutcomesMismatch, match="tiny_gsm8k: the per-sample grades give acc"):
        write_outcomes(flipped, outcome.metrics, k, tmp_path / "x.parquet")
    with pytest.raises(OutcomesMismatch, match="tiny_aime2025: .* samples per problem"):
        write_outcomes(outcome.outcomes.slice(0, len(table) - 1), outcome.metrics, k,
                       tmp_path / "x.parquet")
    with pytest.raises(OutcomesMismatch, match="tiny_aime2025: .* the protocol asks for 2"):
        write_outcomes(outcome.outcomes, outcome.metrics, {**k, "tiny_aime2025": 2},
                       tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()


def test_runs_align_problem_by_problem_or_not_at_all():
    def rows(run_id: str, correct: dict[str, int]) -> pd.DataFrame:
        return pd.DataFrame({"run_id": run_id, "benchmark": "tiny_math", "problem": list(correct),
                             "sample": 0, "answer": "", "correct": np.array(list(correct.values()), dtype=np.int8)})

    table = pd.concat([rows("a", {"p2": 0, "p1": 1, "p3": 1}),
                       rows("b", {"p3": 1, "p1": 0, "p2": 1}),
                       rows("c", {"p1": 1, "p2": 1})], ignore_index=True)
    # problems in id order (p1, p2, p3), whatever order each run wrote them in
    assert aligned_problem_means(table, ["a", "b"])["tiny_math"].tolist() == [[1, 0, 1], [0, 1, 1]]
    assert problem_means(table, "b")["tiny_math"].tolist() == [0, 1, 1]
    with pytest.raises(OutcomesError, match=r"tiny_math: run c was evaluated on other problems"):
        aligned_problem_means(table, ["a", "c"])
    with pytest.raises(OutcomesError, match="tiny_gsm8k: run a has no outcomes of it"):
        aligned_problem_means(table, ["a", "b"], benchmarks=["tiny_gsm8k"])
    with pytest.raises(OutcomesError, match="outcomes of 3 runs"):
        problem_means(table)
