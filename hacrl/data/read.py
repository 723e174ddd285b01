"""Reading prepared data: the only way training and evaluation get at a data source.

Nothing here touches the network. Synthetic sources are (re)written on demand because they are
drawn locally; a hub source that is missing or damaged stops with a one-line message that names
the file and the command that fetches it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hacrl.core.errors import ConfigError
from hacrl.data.files import LocalState, inspect
from hacrl.data.prepare import prepare_source
from hacrl.data.sources import (
    DataError,
    DataMissing,
    Source,
    data_root,
    instruction_text,
    load_sources,
)

__all__ = ["local_file", "load_rows", "local_state"]


def _source(data_cfg: DictConfig, name: str) -> Source:
    sources = load_sources(data_cfg)
    if name not in sources:
        raise ConfigError(f"data source {name}: not in data.sources; known: {', '.join(sources)}")
    return sources[name]


def local_state(data_cfg: DictConfig, name: str) -> LocalState:
    """What is on disk for source `name` (see `LocalState.status`), without preparing anything."""
    return inspect(data_root(data_cfg), _source(data_cfg, name), instruction_text(data_cfg))


def local_file(data_cfg: DictConfig, name: str) -> Path:
    """The verified local jsonl of source `name` (synthetic sources are prepared on demand)."""
    source = _source(data_cfg, name)
    root = data_root(data_cfg)
    instruction = instruction_text(data_cfg)
    state = inspect(root, source, instruction)
    if state.ok:
        return state.path
    if source.kind == "synthetic":
        # Drawn locally and deterministically: rewriting is always safe and needs no network.
        return prepare_source(source, root, instruction, force=True).path
    fetch = f"`hacrl data prepare {name}`"
    if state.status == "missing":
        raise DataMissing(f"data source {name}: {state.path} is missing; fetch it with {fetch} "
                          f"(needs the Hugging Face hub), or point HACRL_DATA / data.root= at a "
                          "directory that has it")
    raise DataError(f"data source {name}: {state.path} is {state.status}: {state.detail}; "
                    f"re-run `hacrl data prepare {name} --force`")


def load_rows(data_cfg: DictConfig, name: str) -> list[dict[str, Any]]:
    """The rows of source `name` (uid, problem, prompt, answer, source and kept fields)."""
    path = local_file(data_cfg, name)
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
