"""Prepared data sources -> verl's RL parquet schema.

verl's RL dataset (`verl.utils.dataset.rl_dataset.RLHFDataset`) reads parquet rows of
    data_source: str, prompt: [{"role": "user", "content": str}], ability: str,
    reward_model: {"style": "rule", "ground_truth": str}, extra_info: {"split", "index", "uid"}
The verl engine's loop draws its prompts itself (hacrl.training.loop.PromptSchedule over the same
prepared rows), so this file is what verl's config points `data.train_files` at and what a
user hands to verl's own tools; its prompts are the rows' `prompt` (the paper's instruction
included), the same text the loop renders with each model's chat template.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hacrl.data import load_rows


def verl_rows(rows: list[dict[str, Any]], name: str, split: str,
              template: str = "{question}", ability: str = "math") -> list[dict[str, Any]]:
    """Our prepared rows as verl RL rows (order kept; `index` is the row's position)."""
    return [{
        "data_source": name,
        "prompt": [{"role": "user", "content": template.format(question=row["prompt"])}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": str(row["answer"])},
        "extra_info": {"split": split, "index": i, "uid": str(row["uid"])},
    } for i, row in enumerate(rows)]


def source_name(data_cfg: DictConfig, split: str) -> str:
    """The data source a task split reads: the split itself (task=math: `math_train`) or the
    synthetic source drawn from that split of the embedded task (task=arith: `train` ->
    `tiny_train`)."""
    from hacrl.core.errors import ConfigError
    from hacrl.data.sources import load_sources

    sources = load_sources(data_cfg)
    if split in sources:
        return split
    drawn = [s.name for s in sources.values() if s.kind == "synthetic" and s.split == split]
    if len(drawn) != 1:
        raise ConfigError(f"split {split}: no data source (data.sources) holds it"
                          + (f"; several do: {', '.join(drawn)}" if drawn else ""))
    return drawn[0]


def parquet_path(data_cfg: DictConfig, name: str) -> Path:
    return Path(str(data_cfg.root)) / "verl" / f"{name}.parquet"


def write_parquet(data_cfg: DictConfig, name: str, split: str = "train",
                  template: str = "{question}", out: Path | None = None) -> Path:
    """Write source `name` as verl parquet (atomically: a temp file renamed into place)."""
    import pandas as pd

    path = out or parquet_path(data_cfg, name)
    frame = pd.DataFrame(verl_rows(load_rows(data_cfg, name), name, split, template))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


__all__ = ["parquet_path", "source_name", "verl_rows", "write_parquet"]
