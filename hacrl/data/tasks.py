"""Task registry: where a job's training prompts and held-out benchmarks come from.

`arith` is the embedded synthetic task (hacrl/task); `math` reads the local copies of MATH and
the paper's benchmarks that `hacrl data prepare` writes (hacrl.data; each row's `prompt` is the
problem with the paper's instruction).
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig

from hacrl.data import arith
from hacrl.data.problem import Problem

Grader = Callable[[list[str], list[str]], list[float]]  # (responses, answers) -> rewards


def check_task(cfg: DictConfig) -> None:
    """Fail early (ConfigError) when a split the job needs is not available locally."""
    from hacrl.core.errors import ConfigError

    name = cfg.task.name
    splits = [cfg.task.train_split, *([cfg.validation.benchmark] if cfg.validation.every else []),
              *(cfg.eval.benchmarks if cfg.eval.at_end else [])]
    if name == "arith":
        for split in splits:
            if split not in arith.SPLITS:
                raise ConfigError(f"split {split}: not a split of task=arith; known: "
                                  f"{', '.join(arith.SPLITS)}")
    elif name == "math":
        from hacrl.data import local_file

        for split in splits:
            local_file(cfg.data, split)  # DataMissing names the file and `hacrl data prepare`
    else:
        raise ConfigError(f"task.name={name}: unknown task; use arith or math")


def load_problems(cfg: DictConfig, split: str) -> list[Problem]:
    if cfg.task.name == "arith":
        return arith.load_split(split)
    from hacrl.data import load_rows

    rows = load_rows(cfg.data, split)
    return [Problem(uid=str(r.get("uid", f"{split}-{i}")), question=r.get("prompt", r["problem"]),
                    answer=str(r["answer"]), level=int(r.get("level", 0) or 0),
                    solution=r.get("solution", ""))
            for i, r in enumerate(rows)]


def validation_problems(cfg: DictConfig) -> list[Problem]:
    """The in-loop validation set: the first `validation.problems` problems of
    `validation.benchmark` (all when null). A split's order is already shuffled, so a prefix
    keeps its mix of levels, and a benchmark sized for the final evaluation's precision does
    not make every validation as long as that evaluation."""
    problems = load_problems(cfg, str(cfg.validation.benchmark))
    limit = cfg.validation.get("problems")
    return problems if limit is None else problems[:int(limit)]


def grader(cfg: DictConfig) -> Grader:
    """The hardened verifier (hacrl.verify) with the job's `verify` settings, shared per setting.

    Every task grades through it: integer answers (the arith task) are settled in this process
    by its exact fast path; other answers go to its time-bounded math-verify workers.
    """
    from hacrl.verify import default_verifier

    return default_verifier(timeout_s=float(cfg.verify.timeout_s),
                            workers=int(cfg.verify.workers)).rewards
