"""The range of every leaf of a job's config, checked right after its type (`hacrl.config.leaves`).

`RANGES` maps a dotted key (`*` stands for one segment: a protocol, a benchmark, a source, a
model) to the values the machinery can run with and that mean what the key says: a gradient
clip of 0 zeroes every gradient and a negative one flips it, a temperature below 0 samples
from the inverted distribution, a learning rate of inf fails three minutes into the job. Each
refusal is one line naming the key, the value and the range; all of a config's refusals are
reported together. Checks that relate two keys (a mini-batch dividing the step, a protocol's
sampled benchmarks) stay with their keys in `hacrl.config.validate`; bools are fully checked by
their type. `tests/test_config_ranges.py` walks every entry with values outside it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hacrl.config.leaves import leaves
from hacrl.core.errors import ConfigError

# integer sizes and counts as torch, numpy and vLLM hold them (int32 indexing, numpy's seeds)
INT32_MAX = 2**31 - 1
SEED_MAX = 2**32 - 1  # numpy.random.seed (lm-eval seeds it with the job's seed)
TOKENS_MAX = 2**20  # a response budget: beyond it no KV cache of any model fits


@dataclass(frozen=True)
class Range:
    """Values a leaf may take. kind: int | real (finite) | choice | text | list."""

    kind: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    null: bool = False  # null allowed (what it means is in the key's comment in the YAML)
    choices: tuple[str, ...] = ()
    pattern: str | None = None  # text: a regular expression the whole text matches
    length: tuple[int, int] | None = None  # list: least and most items
    item: Range | None = None  # list: each item's range
    ordered: bool = False  # list: items non-decreasing ([low, high])
    accept: Callable[[Any], bool] | None = None  # text: any further test
    extra: tuple[Any, ...] = ()  # special values accepted besides the range (auto, -1)
    means: str = ""  # the range in words, when the bounds alone do not say it

    def describe(self) -> str:
        """The range in words: "an integer in [1, 2147483647]", "one of: hf, vllm", ..."""
        text = self.means or self._bounds()
        if self.extra and not self.means:
            text = ", ".join(_show(v) for v in self.extra) + f" or {text}"
        return f"{text}, or null" if self.null else text

    def _bounds(self) -> str:
        if self.kind in ("int", "real"):
            noun = "an integer" if self.kind == "int" else "a finite number"
            if self.low is None and self.high is None:
                return noun
            lo = "(" if self.open_low or self.low is None else "["
            hi = ")" if self.open_high or self.high is None else "]"
            return f"{noun} in {lo}{_num(self.low, '-inf')}, {_num(self.high, 'inf')}{hi}"
        if self.kind == "choice":
            return "one of: " + ", ".join(self.choices)
        if self.kind == "text":
            return "a non-empty text" + (f" matching {self.pattern}" if self.pattern else "")
        assert self.item is not None and self.length is not None
        least, most = self.length
        size = (f"a list of {least}" if least == most else f"a list of {least} to {most}"
                if most < INT32_MAX else "a non-empty list" if least == 1 else "a list")
        order = ", low <= high" if self.ordered else ""
        return f"{size}, each {self.item.describe()}{order}"

    def refuses(self, value: Any) -> bool:
        """Whether `value` is outside the range (its type already checked)."""
        if value is None:
            return not self.null
        if self.extra and any(value == v and type(value) is type(v) for v in self.extra):
            return False
        if self.kind in ("int", "real"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                return True
            if self.kind == "int" and not isinstance(value, int):
                return True
            if not math.isfinite(value):
                return True
            below = self.low is not None and (value <= self.low if self.open_low else value < self.low)
            above = self.high is not None and (value >= self.high if self.open_high
                                               else value > self.high)
            return below or above
        if self.kind == "choice":
            return not isinstance(value, str) or value not in self.choices
        if self.kind == "text":
            if not isinstance(value, str) or not value.strip():
                return True
            if self.pattern and not re.fullmatch(self.pattern, value):
                return True
            return self.accept is not None and not self.accept(value)
        assert self.item is not None and self.length is not None
        if not isinstance(value, list) or not self.length[0] <= len(value) <= self.length[1]:
            return True
        if any(self.item.refuses(v) for v in value):
            return True
        return self.ordered and any(a > b for a, b in zip(value, value[1:], strict=False))

    def outside(self) -> list[Any]:
        """Values outside the range, one of each way out (for tests and the campaign)."""
        out: list[Any] = [] if self.null else [None]
        if self.kind in ("int", "real"):
            step = 1 if self.kind == "int" else 1e-3
            if self.low is not None:
                out.append(self.low if self.open_low else self.low - step)
            if self.high is not None:
                out.append(self.high if self.open_high else self.high + step)
            if self.kind == "int":
                out.append(1.5 if self.low is None or self.low <= 1 else self.low + 0.5)
            else:
                out += [math.nan, math.inf]
            return [int(v) if self.kind == "int" and isinstance(v, float) and v.is_integer()
                    else v for v in out]
        if self.kind == "choice":
            return [*out, "no-such-choice"]
        if self.kind == "text":
            return [*out, " ", *([] if self.pattern is None and self.accept is None else ["{}}"])]
        assert self.item is not None and self.length is not None
        least, most = self.length
        fill = self.item.inside()
        out += [[fill] * (least - 1)] if least > 0 else []
        out += [[fill] * (most + 1)] if most < 8 else []
        out.append([*[fill] * (least - 1), self.item.outside()[-1]] if least > 0
                   else [self.item.outside()[-1]])
        if self.ordered and least >= 2:
            high = self.item.inside(high=True)
            out.append([high, *[fill] * (least - 1)] if high != fill else [high + 1, high])
        return out

    def inside(self, high: bool = False) -> Any:
        """A value inside the range (the lowest, or a higher one with `high`)."""
        if self.kind in ("int", "real"):
            lo = self.low if self.low is not None else 0
            hi = self.high if self.high is not None else lo + 10
            if self.kind == "int":
                return int(hi if high else lo + (1 if self.open_low else 0))
            return (hi if not self.open_high else (lo + hi) / 2) if high else \
                (lo if not self.open_low else (lo + hi) / 2)
        if self.kind == "choice":
            return self.choices[0]
        return "x"


def _num(value: float | None, none: str) -> str:
    if value is None:
        return none
    return str(int(value)) if float(value).is_integer() else str(value)


def count(low: int = 1, high: int = INT32_MAX, null: bool = False, means: str = "",
          extra: tuple[Any, ...] = ()) -> Range:
    return Range("int", low, high, null=null, means=means, extra=extra)


def real(low: float | None = None, high: float | None = None, *, open_low: bool = False,
         open_high: bool = False, null: bool = False) -> Range:
    return Range("real", low, high, open_low, open_high, null=null)


def one_of(*choices: str, null: bool = False) -> Range:
    return Range("choice", choices=choices, null=null)


def text(pattern: str | None = None, null: bool = False, accept: Callable[[Any], bool] | None = None,
         means: str = "") -> Range:
    return Range("text", pattern=pattern, null=null, accept=accept, means=means)


def items(item: Range, least: int = 0, most: int = INT32_MAX, *, null: bool = False,
          ordered: bool = False) -> Range:
    return Range("list", item=item, length=(least, most), null=null, ordered=ordered)


def _formats_question(template: str) -> bool:
    try:
        template.format(question="q")
    except (KeyError, IndexError, ValueError):
        return False
    return "{question}" in template


NAME = r"[A-Za-z0-9][A-Za-z0-9_.+-]*"
TOKENS = count(1, TOKENS_MAX)
PROBABILITY_MASS = real(0.0, 1.0, open_low=True)  # top-p: (0, 1]
TEMPERATURE = real(0.0, 100.0)  # 0 = greedy where a key allows it; the samplers' own check
DTYPES = ("float32", "bfloat16", "float16")

RANGES: dict[str, Range] = {
    # the job
    "seed": count(0, SEED_MAX),
    "agents": Range("list", item=text(NAME), length=(1, INT32_MAX),
                    means="a non-empty list of model names from models/catalog.yaml, e.g. "
                          "agents=[qwen3-4b-base], or a pair (pair=size)"),
    "output_root": text(),
    "timing_repeat": count(0, 1000),
    "cell.id": text(null=True),
    "cell.sweeps": items(text(NAME)),
    # the algorithm (PAPER.md; pair.* are the values algo.* reads)
    "algo.alpha": real(0.0, 100.0),
    "pair.alpha": real(0.0, 100.0),
    "algo.cross_clip_lower": real(0.0, 1.0, open_low=True),
    "pair.cross_clip_lower": real(0.0, 1.0, open_low=True),
    "algo.delta_step": real(0.0, 1.0),
    "pair.cross_clip_step": real(0.0, 1.0),
    "algo.capability_window": count(1, 1_000_000),
    "algo.capability_floor": real(0.0, 1.0, open_low=True, open_high=True),
    "algo.clip_low": real(0.0, 1.0, open_low=True, open_high=True, null=True),
    "algo.clip_high": real(0.0, 10.0, open_low=True, null=True),
    "algo.kl_coef": real(0.0, 100.0),
    "algo.dual_clip_c": real(1.0, 1e6, open_low=True, null=True),
    "algo.omega_clamp": items(real(0.0, 1e6, open_low=True), 2, 2, null=True, ordered=True),
    "algo.sample_order": one_of("mixed", "own_first"),
    "pair.name": text(),
    "pair.setting": text(),
    "pair.agents": items(text(NAME), 1),
    "method.name": text(NAME),
    "profile": text(NAME),
    # training
    "train.steps": count(0, 10_000_000),
    "train.prompts_per_step": count(1),
    "train.minibatch_prompts": count(1),
    "train.rollouts_per_prompt": count(1, 65_536),
    "train.lr": real(0.0, 1.0, open_low=True),
    "train.betas": items(real(0.0, 1.0, open_high=True), 2, 2),
    "train.weight_decay": real(0.0, 1.0),
    "train.grad_clip": real(0.0, 1e6, open_low=True),
    "train.save_every": count(1),
    "train.micro_batch_rows": count(0, null=True,
                                    means="an integer in [0, 2147483647] (0: one pass)"),
    "rollout.max_new_tokens": TOKENS,
    "rollout.temperature": real(0.0, 100.0, open_low=True),
    "rollout.top_p": PROBABILITY_MASS,
    "rollout.overflow": one_of("truncate", "error"),
    "validation.every": count(0),
    "validation.benchmark": text(NAME),
    "validation.problems": count(1, null=True),
    "validation.max_new_tokens": TOKENS,
    "verify.timeout_s": real(0.0, 3600.0, open_low=True),
    "verify.workers": count(1, 256),
    # what jobs cost: USD per GPU-hour by GPU type (an empty mapping by default)
    "cost.gpu_hour_usd.*": real(0.0, 1e6),
    # evaluation
    "eval.use": items(text(NAME), 1),
    "eval.benchmarks": items(text(NAME), 1),
    "eval.only": Range("list", item=text(NAME), length=(1, INT32_MAX), null=True,
                       means="a non-empty list of eval.benchmarks' names, e.g. "
                             "eval.only=[math500] (null: all of them)"),
    "eval.backend": one_of("hf", "vllm"),
    "eval.batch_size": count(1, 1_000_000),
    "eval.greedy_batch_size": count(1, 1_000_000, null=True),
    "eval.dtype": one_of(*DTYPES),
    "eval.vllm.tensor_parallel_size": count(1, 1024),
    "eval.vllm.data_parallel_size": count(1, 1024),
    "eval.vllm.gpu_memory_utilization": PROBABILITY_MASS,
    "eval.vllm.max_prompt_tokens": TOKENS,
    "eval.vllm.cpu_kv_cache_gib": count(1, 1024),
    "eval.protocols.*.name": text(r"[A-Za-z0-9_-]+"),
    "eval.protocols.*.max_new_tokens": TOKENS,
    "eval.protocols.*.temperature": TEMPERATURE,
    "eval.protocols.*.top_p": PROBABILITY_MASS,
    "eval.protocols.*.samples": count(1, 100_000),
    "eval.protocols.*.limit": count(1, null=True),
    "eval.protocols.*.sampled.*.samples": count(1, 100_000),
    "eval.protocols.*.sampled.*.temperature": TEMPERATURE,
    "eval.protocols.*.sampled.*.top_p": PROBABILITY_MASS,
    # the task, the store, the scale
    "task.name": one_of("arith", "math"),
    "task.train_split": text(NAME),
    "task.prompt_template": text(accept=_formats_question,
                                 means="a text with {question} and no other {field}"),
    "tracking.uri": text(null=True),
    "tracking.experiment": text(),
    "scale.name": one_of("tiny", "paper"),
    "scale.model_root": text(null=True),
    "scale.zoo_seed": count(0, SEED_MAX, null=True),
    "scale.eval_tokens.*": TOKENS,
    "scale.eval_samples.*": count(1, 100_000),
    "scale.long_steps": count(1, 10_000_000),
    "scale.cost_steps": count(1, 10_000_000),
    "scale.seeds": items(count(0, SEED_MAX), 1),
    "scale.claim_seeds": items(count(0, SEED_MAX), 1),
    # engines
    "engine.name": one_of("local", "verl"),
    "engine.device": text(r"auto|cpu|cuda(:\d+)?", means="auto, cpu, cuda or cuda:N"),
    "engine.dtype": one_of(*DTYPES),
    "engine.threads": count(1, 4096, null=True),
    "engine.chunk_rows": count(1, 10_000_000),
    "engine.forward_rows": count(1, extra=("auto",)),
    "engine.old_logprobs": one_of("sampler", "recompute"),
    "engine.nnodes": count(1, 4096),
    "engine.gpus_per_node": count(1, 1024),
    "engine.cpu_workers": count(1, 4096),
    "engine.placement": one_of("colocate", "split"),
    "engine.ray.address": text(null=True),
    "engine.ray.port": count(1, 65_535),
    "engine.ray.temp_dir": text(null=True),
    "engine.actor.strategy": one_of("fsdp2", "fsdp"),
    "engine.actor.max_token_len_per_gpu": count(1),
    "engine.actor.fsdp_size": count(1, 1_000_000, extra=(-1,)),  # -1: all GPUs
    "engine.rollout.name": one_of("auto", "vllm", "hf"),
    "engine.rollout.tensor_parallel_size": count(1, 1024),
    "engine.rollout.gpu_memory_utilization": PROBABILITY_MASS,
    "engine.rollout.max_num_batched_tokens": count(1),
    "engine.rollout.log_prob_max_token_len_per_gpu": count(1),
    # catalogs (hacrl.data.sources checks a source's keys as a whole)
    "models.*.family": text(),
    "models.*.tiny": text(null=True),
    "models.*.paper": text(null=True),
    "data.root": text(),
    "data.instruction": text(),
    "data.sources.*.kind": one_of("hub", "synthetic"),
    "data.sources.*.hub_id": text(),
    "data.sources.*.config": text(null=True),
    "data.sources.*.split": text(),
    "data.sources.*.revision": text(),
    "data.sources.*.rows": count(1),
    "data.sources.*.problem": text(),
    "data.sources.*.answer": text(),
    "data.sources.*.answer_rule": one_of("field", "last_boxed", "after_hashes", "first_item"),
    "data.sources.*.keep": items(text()),
    "data.sources.*.id_field": text(null=True),
    "data.sources.*.sha256": text(r"[0-9a-f]{64}", null=True),
}


# `*` patterns, the most specific first (a model's name has dots: models.qwen3-1.7b-base.tiny)
_PATTERNS = [(re.compile(r"\.".join(".+" if s == "*" else re.escape(s) for s in p.split("."))), r)
             for p, r in sorted(RANGES.items(), key=lambda kv: -kv[0].count(".")) if "*" in p]


def range_of(key: str) -> Range | None:
    """The range of dotted `key` (an exact entry, else the first `*` pattern it matches)."""
    if key in RANGES:
        return RANGES[key]
    return next((found for pattern, found in _PATTERNS if pattern.fullmatch(key)), None)


def refusals(cfg: DictConfig) -> Iterator[str]:
    """One line per leaf of `cfg` outside its range: `key=value: must be <range>`.

    A leaf set by an interpolation (`algo.alpha: ${pair.alpha}`) is reported under the key the
    value was written at, once; leaves with no entry (bools, `+key=...` additions, the verl
    overrides mapping) are left to their type check and their keys' own checks."""
    written = dict(leaves(_job_part(OmegaConf.to_container(cfg, resolve=False))))
    try:  # a sweep's config also has Hydra's node, whose ${hydra:...} resolve only in a job
        resolved = {key: OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node)
                    else node for key in cfg if key != "hydra" for node in [cfg[key]]}
    except Exception as err:  # an interpolation that does not resolve
        raise ConfigError(f"{str(err).splitlines()[0]}; check the key it names") from None
    seen: set[str] = set()
    for key, value in leaves(resolved):
        found = range_of(key)
        if found is None or not found.refuses(value):
            continue
        source = _source(key, written)
        if source in seen:
            continue
        seen.add(source)
        read = "" if source == key else f" (read as {key})"
        yield f"{source}={_show(value)}{read}: must be {found.describe()}"


def _job_part(tree: Any) -> Any:
    return {k: v for k, v in tree.items() if k != "hydra"} if isinstance(tree, dict) else tree


def _source(key: str, written: dict[str, Any]) -> str:
    """The key a leaf's value was written at, following plain `${a.b}` interpolations."""
    for _ in range(8):
        value = written.get(key)
        match = re.fullmatch(r"\$\{([A-Za-z0-9_.]+)\}", value) if isinstance(value, str) else None
        if match is None or match.group(1) not in written:
            return key
        key = match.group(1)
    return key


def _show(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(_show(v) for v in value) + "]"
    return "null" if value is None else str(value)


def check_leaf_ranges(cfg: DictConfig) -> None:
    """Raise one ConfigError listing, one line each, every leaf outside its range."""
    found = list(refusals(cfg))
    if found:
        raise ConfigError("\n".join(found))


__all__ = ["RANGES", "Range", "check_leaf_ranges", "range_of", "refusals"]
