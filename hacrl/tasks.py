"""Task registry: where a job's training prompts and held-out benchmarks come from.

`arith` is the embedded synthetic task (hacrl/task); `math` reads local jsonl copies of MATH
and the paper's benchmarks (one object per line with `problem` and `answer`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from hacrl import task as arith
from hacrl.task import Problem

Grader = Callable[[list[str], list[str]], list[float]]  # (responses, answers) -> rewards


def _math_file(cfg: DictConfig, split: str) -> Path:
    return Path(str(cfg.task.data_dir)).expanduser() / f"{split}.jsonl"


def check_task(cfg: DictConfig) -> None:
    """Fail early (ConfigError) when a split the job needs is not available locally."""
    from hacrl.config import ConfigError

    name = cfg.task.name
    splits = [cfg.task.train_split, *([cfg.validation.benchmark] if cfg.validation.every else []),
              *(cfg.eval.benchmarks if cfg.eval.at_end else [])]
    if name == "arith":
        for split in splits:
            if split not in arith.SPLITS:
                raise ConfigError(f"split {split}: not a split of task=arith; known: "
                                  f"{', '.join(arith.SPLITS)}")
    elif name == "math":
        for split in splits:
            path = _math_file(cfg, split)
            if not path.is_file():
                raise ConfigError(f"task=math needs {path}, which is missing; prepare the data "
                                  "(jsonl with `problem` and `answer`) or set task.data_dir")
    else:
        raise ConfigError(f"task.name={name}: unknown task; use arith or math")


def load_problems(cfg: DictConfig, split: str) -> list[Problem]:
    if cfg.task.name == "arith":
        return arith.load_split(split)
    rows = [json.loads(line) for line in _math_file(cfg, split).read_text().splitlines() if line.strip()]
    return [Problem(uid=str(r.get("uid", f"{split}-{i}")), question=r["problem"], answer=str(r["answer"]),
                    level=int(r.get("level", 0) or 0), solution=r.get("solution", ""))
            for i, r in enumerate(rows)]


def grader(cfg: DictConfig) -> Grader:
    """The hardened verifier (hacrl.verify) with the job's `verify` settings, shared per setting.

    Every task grades through it: integer answers (the arith task) are settled in this process
    by its exact fast path; other answers go to its time-bounded math-verify workers.
    """
    from hacrl.verify import default_verifier

    return default_verifier(timeout_s=float(cfg.verify.timeout_s),
                            workers=int(cfg.verify.workers)).rewards
