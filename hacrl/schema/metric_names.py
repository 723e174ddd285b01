"""Metric names: the rules writers follow and the report reads by.

    eval/<protocol>/<benchmark>/<measure>   an lm-eval score (measure: acc, ...)
    eval/<protocol>/avg/<measure>           the mean over the protocol's benchmarks
    val/<benchmark>/acc                     in-loop greedy validation
    time/<phase>_s, time/wall_s, ...        seconds
    memory/<what>_gb                        peak memory
    ratio/<name>_<stat>                     HACPO's importance ratios (s_homo, s_hete)
Per-agent training metrics (loss/, clip/, capability/P, omega/<partner>, ...) keep the names the
loop gives them; the report reads the ones above.
"""

from __future__ import annotations

REPORTED_PREFIXES = ("eval/", "time/", "memory/", "ratio/", "val/")
AVG = "avg"
WALL = "time/wall_s"
STARTUP = "time/startup_s"
TRACKING = "time/tracking_s"


def eval_prefix(protocol: str) -> str:
    return f"eval/{protocol}"


def eval_metric(protocol: str, benchmark: str, measure: str = "acc") -> str:
    return f"{eval_prefix(protocol)}/{benchmark}/{measure}"


def eval_avg(protocol: str, measure: str = "acc") -> str:
    return eval_metric(protocol, AVG, measure)


def parse_eval(name: str) -> tuple[str, str, str] | None:
    """(protocol, benchmark or `avg`, measure) of an `eval_metric` name; None for others."""
    parts = name.split("/")
    if len(parts) != 4 or parts[0] != "eval":
        return None
    return parts[1], parts[2], parts[3]


def eval_seconds(protocol: str) -> str:
    return f"time/eval_{protocol}_s"


def validation(benchmark: str) -> str:
    return f"val/{benchmark}/acc"


def seconds(phase: str) -> str:
    """`time/<phase>` for a phase name that already ends in `_s` (as the timers give them)."""
    return f"time/{phase}"
