"""Run the hacrl_* lm-eval tasks on one model: materialise the tasks, evaluate, collect.

The shipped task YAMLs (lm_eval_tasks/) name their data files relative to the working
directory; `materialize` writes resolved copies into a work folder (absolute data paths,
the protocol's generation settings and repeats, a group over exactly the requested benchmarks),
which are also logged with the results, so every number comes with the tasks that made it.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from hacrl.config.protocol import TASK_DIR, Protocol, task_name
from hacrl.schema.eval_artifacts import samples_file

if TYPE_CHECKING:  # pyarrow is imported where an evaluation runs, not by every job's startup
    import pyarrow as pa

SUITE = "hacrl_suite"


class _Function(str):
    """A `!function module.name` scalar, kept as a tag through load and dump."""


class _Loader(yaml.SafeLoader):
    pass


class _Dumper(yaml.SafeDumper):
    pass


_Loader.add_constructor("!function", lambda loader, node: _Function(loader.construct_scalar(node)))
_Dumper.add_representer(_Function, lambda dumper, v: dumper.represent_scalar("!function", str(v)))


def load_task_yaml(path: Path) -> dict[str, Any]:
    """A task YAML with its `include` merged in (the include first, the file on top)."""
    node = yaml.load(path.read_text(), Loader=_Loader) or {}
    base = node.pop("include", None)
    return {**load_task_yaml(path.parent / base), **node} if base else node


def materialize(benchmarks: list[str], data_files: dict[str, Path], protocol: Protocol,
                dest: Path) -> list[str]:
    """Write resolved task YAMLs + utils.py + the `hacrl_suite` group into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(TASK_DIR / "utils.py", dest / "utils.py")
    names = []
    for benchmark in benchmarks:
        shipped = TASK_DIR / f"{task_name(benchmark)}.yaml"
        if not shipped.is_file():
            from hacrl.core.errors import ConfigError

            known = sorted(p.stem.removeprefix("hacrl_") for p in TASK_DIR.glob("hacrl_*.yaml")
                           if p.stem not in ("hacrl_paper", "hacrl_tiny"))
            raise ConfigError(f"eval.benchmarks: no lm-eval task for {benchmark!r}; known: "
                              f"{', '.join(known)}")
        task = load_task_yaml(shipped)
        sampling = protocol.sampling_for(benchmark)
        task["dataset_kwargs"] = {"data_files": {"test": str(Path(data_files[benchmark]).resolve())}}
        task["generation_kwargs"] = sampling.generation_kwargs(protocol.max_new_tokens)
        task["repeats"] = sampling.samples
        task["metadata"] = {**task.get("metadata", {}), "hacrl_protocol": protocol.to_dict()}
        (dest / f"{task['task']}.yaml").write_text(yaml.dump(task, Dumper=_Dumper, sort_keys=False))
        names.append(str(task["task"]))
    group = {"group": SUITE, "task": names,
             "aggregate_metric_list": [{"metric": m, "aggregation": "mean", "weight_by_size": False}
                                       for m in ("acc", "exact_match")],
             "metadata": {"version": 1.0}}
    (dest / f"{SUITE}.yaml").write_text(yaml.dump(group, sort_keys=False))
    return names


@dataclass
class Backend:
    """Where generation runs: `hf` (transformers; CPU or one GPU) or `vllm` (GPUs)."""

    name: str = "hf"
    batch_size: int = 64
    dtype: str = "float32"
    device: str = "cpu"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    max_prompt_tokens: int = 1024
    greedy_batch_size: int | None = None  # hf: greedy requests' batch size (None: batch_size)
    cpu_kv_cache_gib: int = 1  # vLLM's CPU build: its KV cache

    @classmethod
    def from_config(cls, eval_cfg: Any, device: str) -> Backend:
        v = eval_cfg.vllm
        greedy = eval_cfg.get("greedy_batch_size")
        return cls(str(eval_cfg.backend), int(eval_cfg.batch_size), str(eval_cfg.dtype), device,
                   int(v.tensor_parallel_size), int(v.data_parallel_size),
                   float(v.gpu_memory_utilization), int(v.max_prompt_tokens),
                   int(greedy) if greedy else None, int(v.get("cpu_kv_cache_gib", 1)))

    def model_args(self, model_path: str, protocol: Protocol, seed: int,
                   vllm_on_cpu: bool = False) -> dict[str, Any]:
        """lm-eval model_args for this backend (the chat template's thinking switch included;
        `vllm_on_cpu`: the installed vLLM is its CPU build)."""
        common: dict[str, Any] = {"pretrained": model_path, "dtype": self.dtype,
                                  "enable_thinking": protocol.enable_thinking}
        if self.name == "hf":
            return {**common, "device": self.device, "batch_size": self.batch_size,
                    "greedy_batch_size": self.greedy_batch_size or self.batch_size}
        if self.name == "vllm":
            args = {**common, "tensor_parallel_size": self.tensor_parallel_size,
                    "data_parallel_size": self.data_parallel_size,
                    "gpu_memory_utilization": self.gpu_memory_utilization,
                    # a prompt longer than max_prompt_tokens is refused (vllm_lm), not cut
                    "max_model_len": self.max_prompt_tokens + protocol.max_new_tokens,
                    "seed": seed}
            if vllm_on_cpu:
                # vLLM's CPU build reserves gpu_memory_utilization of the machine's whole
                # memory (0.85: most of it) for its KV cache unless told a size, and refuses
                # to start when that much is not free (as on a machine running anything else)
                args["kv_cache_memory_bytes"] = self.cpu_kv_cache_gib * 2**30
            return args
        from hacrl.core.errors import ConfigError

        raise ConfigError(f"eval.backend={self.name}: unknown backend; use hf or vllm")

    def make_lm(self, model_path: str, protocol: Protocol, seed: int) -> Any:
        """The lm-eval model, built from `model_args` as lm-eval's `simple_evaluate` builds it
        (hf: its `hf` model with separate greedy and sampled batch sizes; vllm: its `vllm`
        model refusing prompts over the budget, `hacrl.evaluation.vllm_lm`)."""
        if self.name == "vllm":
            from hacrl.config.vllm_models import vllm_on_cpu

            args = self.model_args(model_path, protocol, seed, vllm_on_cpu=vllm_on_cpu())
        else:
            args = self.model_args(model_path, protocol, seed)
        if self.name == "hf":
            from hacrl.evaluation.hf_lm import SplitBatchHFLM

            return SplitBatchHFLM.create_from_arg_obj(args)
        if self.name == "vllm":  # lm-eval's vllm model, refusing prompts it would cut
            from hacrl.evaluation.vllm_lm import make_vllm_lm

            return make_vllm_lm(args)
        from lm_eval.api.registry import get_model

        return get_model(self.name).create_from_arg_obj(args)


@dataclass
class EvalOutcome:
    """Per-benchmark metrics (names as logged), the macro average, per-sample records and the
    compact outcomes table made from them (`hacrl.evaluation.outcome_table`)."""

    metrics: dict[str, dict[str, float]]
    average: dict[str, float]
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    seconds: float = 0.0
    lm_eval_version: str = ""
    outcomes: pa.Table | None = None


def _sample_record(sample: dict[str, Any]) -> dict[str, Any]:
    doc = sample.get("doc", {})
    prompt = sample.get("arguments", [[None]])[0][0]
    grades = sample.get("filtered_resps") or [[]]  # one entry per request: [[grade, ...]]
    return {"uid": doc.get("uid"), "answer": doc.get("answer"), "prompt": prompt,
            "responses": sample.get("resps", [[]])[0], "grades": grades[0],
            "acc": sample.get("acc"), "exact_match": sample.get("exact_match")}


def evaluate_suite(make_lm: Callable[[], Any], manager: Any, seed: int,
                   limit: int | None) -> dict[str, Any] | None:
    """lm-eval's `simple_evaluate` for the `hacrl_suite` group, less its environment report.

    The steps of `simple_evaluate` up to its call of lm-eval's `evaluate`, in its order (the
    seeds before the model is built, then the tasks, zero-shot, the few-shot seed), then
    `evaluate` with the same arguments. What is left out runs after the results are in:
    the report of the environment, which runs torch's `collect_env` (`pip list` and a dozen
    other commands: 0.5-0.8 s of each tiny evaluation on a busy 2-core CPU, more than task
    building and grading together) and git, for fields hacrl never reads.
    """
    import numpy as np
    from lm_eval.evaluator import evaluate
    from lm_eval.utils import set_torch_seed

    random.seed(seed)
    np.random.seed(seed)
    set_torch_seed(seed)
    lm = make_lm()
    try:
        loaded = manager.load([SUITE])
        for task in loaded["tasks"].values():
            if task.get_config("num_fewshot") is None:
                task.set_config(key="num_fewshot", value=0)
            task.set_fewshot_seed(seed=seed)
            rows_in_memory(task)
        return evaluate(lm=lm, task_dict=loaded, limit=limit, bootstrap_iters=0,
                        log_samples=True, apply_chat_template=True, fewshot_as_multiturn=True,
                        verbosity="ERROR")
    finally:
        release_engine(lm)


def release_engine(lm: Any) -> None:
    """Stop the vLLM engine behind an lm-eval `vllm` model now (a no-op for other models).

    vLLM runs its engine core in a child process that is stopped only when the `LLM` object
    is garbage-collected; lm-eval keeps no handle to stop it. A job evaluating its agents one
    after another would otherwise start the next agent's engine while the last one still
    holds its memory (a GPU's, or on CPU its KV cache), and on a loaded machine the new
    engine's start-up fails.
    """
    engine = getattr(getattr(lm, "model", None), "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    shutdown = getattr(core, "shutdown", None)
    if callable(shutdown):
        shutdown()


def rows_in_memory(task: Any) -> None:
    """Hold each split of a loaded task as a list of row dicts instead of an Arrow dataset.

    `evaluate` walks a task's documents twice (to build the requests, then to score them),
    and `datasets` builds every row anew on each pass, one Python dict at a time through its
    formatter (~0.4 s of a tiny evaluation's 7,300 rows); the rows come out the same when the
    whole split is read once through the same formatter. A task whose `process_docs` expects
    a `datasets.Dataset` keeps its dataset.
    """
    if (getattr(task.config, "process_docs", None) is not None
            or getattr(getattr(task, "fewshot_cfg", None), "process_docs", None) is not None):
        return
    dataset = getattr(task, "dataset", None)
    if not isinstance(dataset, dict):  # a DatasetDict is a dict of split -> Dataset
        return
    task.dataset = {split: split_rows(rows) for split, rows in dataset.items()}


def split_rows(split: Any) -> Any:
    """A `datasets.Dataset` as the list of the rows iterating it gives (other values as they
    are): its columns read in one formatted slice, then zipped into rows."""
    import datasets

    if not isinstance(split, datasets.Dataset) or not split.column_names:
        return split
    columns = split[:]
    names = list(columns)
    return [dict(zip(names, values, strict=True))
            for values in zip(*(columns[n] for n in names), strict=True)]


def run_lm_eval(model_path: str, benchmarks: list[str], data_files: dict[str, Path],
                protocol: Protocol, backend: Backend, workdir: Path, seed: int = 0,
                limit: int | None = None, lm: Any = None) -> EvalOutcome:
    """Evaluate one model on the benchmarks through lm-eval (`evaluate_suite`).

    `lm` replaces the backend by a ready lm-eval `LM` instance (tests script the responses).
    """
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the data are local json files
    started = time.perf_counter()
    import datasets
    import lm_eval
    from lm_eval.tasks import TaskManager

    from hacrl.evaluation.outcome_table import outcomes_table

    datasets.disable_progress_bars()  # local json files load in milliseconds
    for noisy in ("lm_eval", "lm-eval", "datasets", "httpx"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    names = materialize(benchmarks, data_files, protocol, workdir / "tasks")
    manager = TaskManager(include_path=str(workdir / "tasks"), include_defaults=False,
                          verbosity="ERROR")
    res = evaluate_suite((lambda: lm) if lm is not None else
                         (lambda: backend.make_lm(model_path, protocol, seed)),
                         manager, seed, limit if limit is not None else protocol.limit)
    if res is None:  # lm-eval returns None on non-zero ranks of a distributed run
        raise RuntimeError("lm-eval returned no results (not the main process?)")
    metrics: dict[str, dict[str, float]] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    for benchmark, name in zip(benchmarks, names, strict=True):
        row = res["results"][name]
        k = protocol.sampling_for(benchmark).samples
        got = {"acc": float(row["acc,graded"]), "exact_match": float(row["exact_match,graded"])}
        if k > 1:
            got[f"avg_at_{k}"] = got["acc"]
            got[f"pass_at_{k}"] = float(row["pass_at_k,graded"])
        metrics[benchmark] = got
        samples[benchmark] = [_sample_record(s) for s in res.get("samples", {}).get(name, [])]
    # AVG is the mean of the benchmarks (the paper's definition), recomputed here and
    # checked against lm-eval's own group aggregate.
    average = {m: sum(v[m] for v in metrics.values()) / len(metrics) for m in ("acc", "exact_match")}
    group = res["results"].get(SUITE, {})
    if "acc,graded" in group and abs(float(group["acc,graded"]) - average["acc"]) > 1e-9:
        raise RuntimeError(f"lm-eval's group average {group['acc,graded']} differs from the mean "
                           f"of the benchmarks {average['acc']}")
    return EvalOutcome(metrics, average, samples, time.perf_counter() - started,
                       getattr(lm_eval, "__version__", ""), outcomes_table(samples))


def write_samples(outcome: EvalOutcome, folder: Path) -> list[Path]:
    """One gzipped jsonl of per-sample records per benchmark (the verbose artifact logged with
    the scores: prompts and responses are most of an evaluation's bytes, and repeat a lot)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for benchmark, records in outcome.samples.items():
        path = folder / samples_file(benchmark)
        # no time or name in the gzip header: the same records give the same bytes
        with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", filename="",
                                                   mtime=0) as packed, \
                io.TextIOWrapper(packed, encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, default=str, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths
