"""An evaluation protocol: how responses are generated, as explicit and recorded config.

The paper evaluates greedily (avg@1) with 8196 new tokens for the main tables and 4096 for
the other ablations; AIME2025 is sampled k times at temperature T (avg@k and pass@k). A
protocol's `key` hashes everything that changes the numbers, so an evaluation is identified
by (checkpoint, protocol key) and never repeated for the same pair.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The shipped lm-eval task files (one `hacrl_<benchmark>.yaml` each); the config checks them.
# the lm-eval task files hacrl ships (package data of `hacrl.evaluation`, which runs them)
TASK_DIR = Path(__file__).resolve().parents[1] / "evaluation" / "lm_eval_tasks"


def task_name(benchmark: str) -> str:
    return f"hacrl_{benchmark}"


def paper_benchmark(benchmark: str) -> str:
    """The paper benchmark a name stands for: `tiny_aime2025` -> `aime2025`."""
    return benchmark.removeprefix("tiny_")


def benchmark_data(cfg: Any) -> dict[str, str | None]:
    """Benchmark -> the sha256 its data source pins in the catalog (`data.sources.<name>`;
    None where the catalog pins none), for every benchmark of `eval.benchmarks`."""
    sources = cfg.data.get("sources") or {}
    out: dict[str, str | None] = {}
    for benchmark in cfg.eval.benchmarks:
        source = sources.get(str(benchmark)) or {}
        sha = source.get("sha256")
        out[str(benchmark)] = str(sha) if sha else None
    return out


def evaluated_benchmarks(eval_cfg: Any) -> list[str]:
    """The benchmarks an evaluation runs: `eval.only` (names as in `eval.benchmarks`, or their
    paper names: `math500` picks `tiny_math500`) in `eval.benchmarks`' order; null: all of them.
    A sweep whose tables read one benchmark (Table 6 and the alpha ablation read MATH-500)
    evaluates only that one; the run's benchmarks tag says which were evaluated."""
    from hacrl.core.errors import ConfigError

    benchmarks = [str(b) for b in eval_cfg.benchmarks]
    only = eval_cfg.get("only")
    if only is None:
        return benchmarks
    if isinstance(only, str) or not hasattr(only, "__iter__") or not list(only):
        raise ConfigError(f"eval.only={only!r}: a non-empty list of benchmarks, e.g. "
                          "eval.only=[math500], or null for all of eval.benchmarks")
    wanted = [str(b) for b in only]
    unknown = [b for b in wanted if not any(b in (x, paper_benchmark(x)) for x in benchmarks)]
    if unknown:
        raise ConfigError(f"eval.only: {unknown[0]} is not one of eval.benchmarks "
                          f"({', '.join(benchmarks)})")
    return [b for b in benchmarks if b in wanted or paper_benchmark(b) in wanted]


@dataclass(frozen=True)
class Sampling:
    """k responses per problem; temperature 0 means greedy (k must then be 1)."""

    samples: int = 1
    temperature: float = 0.0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generation_kwargs(self, max_new_tokens: int) -> dict[str, Any]:
        """lm-eval `generation_kwargs` (stop at EOS only, which lm-eval adds itself)."""
        kwargs: dict[str, Any] = {"until": [], "max_gen_toks": max_new_tokens}
        if self.greedy:
            return {**kwargs, "do_sample": False}
        return {**kwargs, "do_sample": True, "temperature": self.temperature, "top_p": self.top_p}


@dataclass(frozen=True)
class Protocol:
    name: str
    max_new_tokens: int
    default: Sampling
    sampled: dict[str, Sampling] = field(default_factory=dict)  # paper benchmark -> sampling
    enable_thinking: bool = False
    limit: int | None = None  # the first k problems of each benchmark (None: all of them)
    # benchmark -> the pinned sha256 of its data file (None: not pinned): a redrawn or resized
    # benchmark changes the key, so scores on other problems never count as this evaluation
    data: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def from_config(cls, node: Any, where: str = "eval.protocol",
                    data: dict[str, str | None] | None = None) -> Protocol:
        """Build from a protocol node (DictConfig or mapping); errors name the key `where`.X.
        `data`: the benchmarks' data pins (`benchmark_data`), part of the key."""
        from hacrl.core.errors import ConfigError

        def sampling(where: str, n: Any) -> Sampling:
            s = Sampling(int(n.get("samples", 1)), float(n.get("temperature", 0.0)),
                         float(n.get("top_p", 1.0)))
            if s.samples < 1:
                raise ConfigError(f"{where}.samples={s.samples}: must be >= 1")
            if s.greedy and s.samples != 1:
                raise ConfigError(f"{where}: samples={s.samples} with temperature 0 repeats the "
                                  "same greedy answer; set a temperature > 0 or samples=1")
            if not 0.0 < s.top_p <= 1.0:
                raise ConfigError(f"{where}.top_p={s.top_p}: must be in (0, 1]")
            return s

        name = str(node.get("name", ""))
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"{where}.name={name!r}: give a short name of letters, "
                              "digits, - or _ (it becomes part of metric names)")
        tokens = int(node.get("max_new_tokens", 0))
        if tokens < 1:
            raise ConfigError(f"{where}.max_new_tokens={tokens}: must be >= 1")
        sampled = {str(b): sampling(f"{where}.sampled.{b}", n)
                   for b, n in (node.get("sampled") or {}).items()}
        limit = node.get("limit")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 1):
            raise ConfigError(f"{where}.limit={limit}: must be an integer >= 1 (the first k "
                              "problems of each benchmark), or null for all of them")
        return cls(name, tokens, sampling(where, node), sampled,
                   bool(node.get("enable_thinking", False)), limit, dict(data or {}))

    @classmethod
    def in_use(cls, eval_cfg: Any, data: dict[str, str | None] | None = None) -> list[Protocol]:
        """The protocols `eval.use` names, from their definitions in `eval.protocols`."""
        from hacrl.core.errors import ConfigError

        defined = eval_cfg.get("protocols") or {}
        names = list(eval_cfg.get("use") or [])
        if not names:
            raise ConfigError("eval.use=[]: name at least one protocol, e.g. eval.use=[main]")
        out = []
        for name in names:
            if name not in defined:
                raise ConfigError(f"eval.use: unknown protocol {name!r}; defined in "
                                  f"eval.protocols: {', '.join(defined)}")
            protocol = cls.from_config(defined[name], where=f"eval.protocols.{name}", data=data)
            if protocol.name != name:
                raise ConfigError(f"eval.protocols.{name}.name={protocol.name}: must be {name}")
            out.append(protocol)
        return out

    def sampling_for(self, benchmark: str) -> Sampling:
        return self.sampled.get(paper_benchmark(benchmark), self.default)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "max_new_tokens": self.max_new_tokens,
                "default": asdict(self.default),
                "sampled": {b: asdict(s) for b, s in sorted(self.sampled.items())},
                "enable_thinking": self.enable_thinking,
                **({"limit": self.limit} if self.limit is not None else {}),
                **({"data": dict(sorted(self.data.items()))} if self.data else {})}

    @property
    def key(self) -> str:
        """12 hex digits over everything but the name (same settings, same numbers)."""
        body = {k: v for k, v in self.to_dict().items() if k != "name"}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]

    def metric_names(self, benchmark: str) -> list[str]:
        """Per-benchmark metric names as logged (`@` is not allowed in MLflow names)."""
        s = self.sampling_for(benchmark)
        names = ["acc", "exact_match"]
        if s.samples > 1:
            names += [f"avg_at_{s.samples}", f"pass_at_{s.samples}"]
        return names
