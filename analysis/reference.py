"""The paper's published numbers (reference/paper/*.csv, copied from the paper's tables).

Quirks are kept as published (see PAPER.md): `avg_printed` rows hold the AVG the paper prints,
which is not always the mean of its seven cells; values the paper does not give are absent.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pandas as pd

PAPER_DIR = Path(__file__).parent / "reference" / "paper"
# the per-agent designs of a tiny Table-1 pilot (scripts/tiny_design.py --write)
DESIGNS_FILE = Path(__file__).parent / "reference" / "tiny" / "designs.json"
# the seven evaluation benchmarks, in the paper's column order
BENCHMARKS = ("math500", "math", "gsm8k", "aime2025", "amc23", "minerva", "olympiad")
LABELS = {"math500": "MATH-500", "math": "MATH", "gsm8k": "GSM8K", "aime2025": "AIME2025",
          "amc23": "AMC23", "minerva": "Minerva", "olympiad": "OlympiadBench", "avg": "AVG"}
METHOD_LABELS = {"base": "Base", "grpo": "GRPO", "gspo": "GSPO", "gspo_x2": "GSPOx2",
                 "gspo_updates_x2": "GSPO (2x updates)", "naive": "Naive", "hacpo": "HACPO",
                 "hacpo_no_adv": "HACPO w/o cap. advantage", "hacpo_no_omega": "HACPO w/o omega",
                 "hacpo_no_stepwise": "HACPO w/o stepwise clip", "hacpo_no_clip": "HACPO w/o clip"}


@cache
def paper(name: str) -> pd.DataFrame:
    """One reference table, e.g. `paper("benchmarks")`; a copy is safe to modify."""
    path = PAPER_DIR / f"{name}.csv"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PAPER_DIR.glob("*.csv")))
        raise FileNotFoundError(f"no reference table {name!r} in {PAPER_DIR}; known: {known}")
    return pd.read_csv(path)


def benchmark_values(table: str) -> dict[tuple[str, str, str, str], float]:
    """{(pair, model, method, benchmark): value} of one table of benchmarks.csv."""
    df = paper("benchmarks")
    df = df[df["table"] == table]
    return {(r.pair, r.model, r.method, r.benchmark): float(r.value)
            for r in df.itertuples(index=False)}


def headline(claim: str) -> tuple[float, str]:
    """The paper's headline number for `claim` (headlines.csv) in the version whose tables
    benchmarks.csv holds (v3), and a note naming every version's number: (value, note)."""
    df = paper("headlines")
    rows = df[df["claim"] == claim]
    if rows.empty:
        raise KeyError(f"no headline {claim!r} in {PAPER_DIR / 'headlines.csv'}")
    current = rows.iloc[0]
    note = "; ".join(f"{r.version} {r.where}: {r.value:+.1f} {r.unit}"
                     for r in rows.itertuples(index=False))
    return float(current["value"]), note


@cache
def pilot_designs() -> dict[str, dict]:
    """{"pair/agent": design record} of the tiny pilot, and where it was measured (key
    "measured"); empty without the file."""
    import json

    if not DESIGNS_FILE.is_file():
        return {}
    data = json.loads(DESIGNS_FILE.read_text())
    return {**data["comparisons"], "measured": data["measured"]}


def paper_benchmark(name: str) -> str:
    """tiny_math500 -> math500 (tiny stand-ins sit in the paper benchmark's column)."""
    return name.removeprefix("tiny_")
