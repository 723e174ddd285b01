"""Evaluation protocol and the materialised lm-eval tasks (no model involved)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hacrl.config import ConfigError, compose
from hacrl.config.protocol import Protocol, paper_benchmark
from hacrl.evaluation.lmeval import SUITE, TASK_DIR, Backend, load_task_yaml, materialize

PAPER = ["math500", "math", "gsm8k", "aime2025", "amc23", "minerva", "olympiad"]


def test_paper_protocols_are_explicit_and_differ_only_in_budget() -> None:
    main, ablation = Protocol.in_use(compose(["scale=paper", "eval.use=[main,ablation]"]).eval)
    assert (main.name, main.max_new_tokens, ablation.max_new_tokens) == ("main", 8196, 4096)
    assert main.default.greedy and main.default.samples == 1
    aime = main.sampling_for("aime2025")
    assert (aime.samples, aime.temperature, aime.top_p) == (16, 0.6, 0.95)
    assert main.sampling_for("tiny_aime2025") == aime  # the stand-in follows its benchmark
    assert main.sampling_for("gsm8k") == main.default
    assert main.key != ablation.key
    assert main.metric_names("aime2025") == ["acc", "exact_match", "avg_at_16", "pass_at_16"]
    assert main.metric_names("math500") == ["acc", "exact_match"]


def test_protocol_key_ignores_the_name_and_follows_every_setting() -> None:
    base = compose([]).eval.protocols.main
    key = Protocol.from_config(base).key
    renamed = compose(["eval.protocols.main.name=other"]).eval.protocols.main
    assert Protocol.from_config(renamed).key == key
    # at tiny scale main and ablation have the same settings, so the same key
    assert Protocol.from_config(compose([]).eval.protocols.ablation).key == key
    for override in ("max_new_tokens=31", "sampled.aime2025.samples=8",
                     "sampled.aime2025.temperature=1.0", "enable_thinking=true", "limit=20"):
        node = compose([f"eval.protocols.main.{override}"]).eval.protocols.main
        assert Protocol.from_config(node).key != key, override


def test_protocol_key_follows_the_benchmarks_data() -> None:
    """Scores on other problems (a resized or redrawn benchmark) never count as this evaluation:
    the pinned sha256 of every evaluated benchmark is part of the key."""
    from hacrl.config.protocol import benchmark_data

    cfg = compose([])
    key = Protocol.in_use(cfg.eval, data=benchmark_data(cfg))[0].key
    assert key != Protocol.in_use(cfg.eval)[0].key
    other = compose(["data.sources.tiny_gsm8k.sha256=" + "0" * 64])
    assert Protocol.in_use(other.eval, data=benchmark_data(other))[0].key != key
    fewer = compose(["eval.benchmarks=[tiny_gsm8k]"])
    assert benchmark_data(fewer) == {"tiny_gsm8k": benchmark_data(cfg)["tiny_gsm8k"]}
    assert set(benchmark_data(compose(["scale=paper"])).values()) == {None}  # hub data: unpinned


@pytest.mark.parametrize(("override", "message"), [
    ("eval.protocols.main.samples=4", "temperature 0"),
    ("eval.protocols.main.max_new_tokens=0", "eval.protocols.main.max_new_tokens=0"),
    ("eval.protocols.main.sampled.aime2025.top_p=0", "eval.protocols.main.sampled.aime2025.top_p=0"),
    ("eval.protocols.main.name=a/b", "eval.protocols.main.name"),
    ("eval.use=[main,best]", "eval.use: unknown protocol 'best'"),
    ("eval.use=[]", "eval.use=[]"),
    ("eval.protocols.main.limit=0", "eval.protocols.main.limit=0"),
    ("eval.protocols.main.limit=abc", "eval.protocols.main.limit=abc"),
])
def test_bad_protocol_is_one_line_naming_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        Protocol.in_use(compose([override]).eval)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_every_benchmark_has_a_shipped_task_and_groups_list_them() -> None:
    for bench in PAPER:
        for name in (bench, f"tiny_{bench}"):
            assert (TASK_DIR / f"hacrl_{name}.yaml").is_file(), name
            assert paper_benchmark(name) == bench
    for scale, prefix in (("paper", ""), ("tiny", "tiny_")):
        group = yaml.safe_load((TASK_DIR / f"hacrl_{scale}.yaml").read_text())
        assert group["task"] == [f"hacrl_{prefix}{b}" for b in PAPER]
        assert all(not m["weight_by_size"] for m in group["aggregate_metric_list"])


def test_materialize_resolves_paths_generation_and_repeats(tmp_path: Path) -> None:
    protocol = Protocol.from_config(compose(["scale=paper"]).eval.protocols.main)
    files = {b: tmp_path / "data" / f"{b}.jsonl" for b in ("math500", "aime2025")}
    names = materialize(list(files), files, protocol, tmp_path / "tasks")
    assert names == ["hacrl_math500", "hacrl_aime2025"]
    m500 = load_task_yaml(tmp_path / "tasks" / "hacrl_math500.yaml")
    assert m500["dataset_kwargs"]["data_files"]["test"] == str(files["math500"].resolve())
    assert m500["generation_kwargs"] == {"until": [], "max_gen_toks": 8196, "do_sample": False}
    assert m500["repeats"] == 1 and "include" not in m500
    aime = load_task_yaml(tmp_path / "tasks" / "hacrl_aime2025.yaml")
    assert aime["repeats"] == 16
    assert aime["generation_kwargs"] == {"until": [], "max_gen_toks": 8196, "do_sample": True,
                                         "temperature": 0.6, "top_p": 0.95}
    text = (tmp_path / "tasks" / "hacrl_aime2025.yaml").read_text()
    assert "!function 'utils.grade_responses'" in text or "!function utils.grade_responses" in text
    group = yaml.safe_load((tmp_path / "tasks" / f"{SUITE}.yaml").read_text())
    assert group["task"] == names
    assert (tmp_path / "tasks" / "utils.py").is_file()


def test_materialized_tasks_load_in_lm_eval(tmp_path: Path) -> None:
    """lm-eval builds the suite from the written folder (task configs parse, group resolves)."""
    from lm_eval.tasks import TaskManager

    from hacrl.data import local_file

    cfg = compose([f"data.root={tmp_path / 'data'}"])
    protocol = Protocol.from_config(cfg.eval.protocols.main)
    benches = ["tiny_gsm8k", "tiny_aime2025"]
    files = {b: local_file(cfg.data, b) for b in benches}  # synthetic: written on demand
    materialize(benches, files, protocol, tmp_path / "tasks")
    manager = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    loaded = manager.load([SUITE])
    flat = loaded["tasks"]
    assert set(flat) == {"hacrl_tiny_gsm8k", "hacrl_tiny_aime2025"}
    assert loaded["group_map"][SUITE] == ["hacrl_tiny_gsm8k", "hacrl_tiny_aime2025"]
    assert flat["hacrl_tiny_aime2025"].config.repeats == 4  # scale.eval_samples at tiny
    assert len(flat["hacrl_tiny_gsm8k"].test_docs()) == 900


def test_vllm_model_args_size_the_context_from_the_protocol() -> None:
    cfg = compose(["scale=paper", "eval.vllm.tensor_parallel_size=2",
                   "eval.vllm.data_parallel_size=4", "eval.vllm.max_prompt_tokens=1000"])
    protocol = Protocol.from_config(cfg.eval.protocols.ablation)
    args = Backend.from_config(cfg.eval, "cuda").model_args("/m", protocol, seed=3)
    assert args["max_model_len"] == 1000 + 4096
    assert (args["tensor_parallel_size"], args["data_parallel_size"]) == (2, 4)
    assert args["enable_thinking"] is False and args["dtype"] == "bfloat16" and args["seed"] == 3
    # on a GPU vLLM sizes its cache from gpu_memory_utilization; on vLLM's CPU build it is set
    assert "kv_cache_memory_bytes" not in args
    on_cpu = compose(["eval.backend=vllm", "eval.vllm.cpu_kv_cache_gib=3"]).eval
    assert Backend.from_config(on_cpu, "auto").model_args("/m", protocol, 0, vllm_on_cpu=True)[
        "kv_cache_memory_bytes"] == 3 * 2**30
    hf = Backend.from_config(compose([]).eval, "cpu").model_args("/m", protocol, seed=0)
    assert hf["device"] == "cpu" and "max_model_len" not in hf
    with pytest.raises(ConfigError, match="eval.backend=tpu"):
        Backend("tpu").model_args("/m", protocol, 0)
