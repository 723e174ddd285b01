"""Data sources named in `experiments/data/catalog.yaml`, validated into `Source` objects.

A source is either a Hugging Face hub dataset (`kind: hub`, pinned by hub id, config, split and
revision) or a split of the embedded synthetic task (`kind: synthetic`, see `hacrl.data.arith`).
Every source is written to `<data.root>/<name>.jsonl`; what each key means is documented in
the catalog itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hacrl.core.errors import ConfigError

__all__ = [
    "ANSWER_RULES",
    "DataError",
    "DataMissing",
    "HubUnreachable",
    "Source",
    "data_root",
    "instruction_text",
    "load_sources",
    "source_scale",
]

# How the final answer is read from the `answer` field of a hub row.
ANSWER_RULES = ("field", "last_boxed", "after_hashes", "first_item")
# Keys every written row has; kept extras may not shadow them.
BASE_FIELDS = ("uid", "problem", "prompt", "answer", "source")

_HUB_REQUIRED = ("hub_id", "split", "revision", "rows", "problem", "answer")
_HUB_OPTIONAL = ("kind", "config", "answer_rule", "keep", "id_field", "sha256", "instruction")
_SYNTHETIC_REQUIRED = ("kind", "split")
_SYNTHETIC_OPTIONAL = ("rows", "sha256", "instruction")


class DataError(ConfigError):
    """A data source that cannot be prepared or read; the message is one line."""


class DataMissing(DataError):
    """A hub source that has not been prepared locally (the message says how to fetch it)."""


class HubUnreachable(DataError):
    """The Hugging Face hub could not be reached while downloading a source."""


@dataclass(frozen=True)
class Source:
    """One entry of `data.sources`, checked; `hub_id` is None for synthetic sources."""

    name: str
    kind: str  # "hub" or "synthetic"
    split: str  # hub split, or the hacrl.data.arith split of a synthetic source
    rows: int | None  # expected row count (None: a synthetic split's own size)
    instruction: bool  # whether the prompt gets the paper's instruction appended
    sha256: str | None = None  # pinned sha256 of the written jsonl, when known
    hub_id: str | None = None
    config: str | None = None
    revision: str | None = None
    problem: str = "problem"
    answer: str = "answer"
    answer_rule: str = "field"
    keep: tuple[str, ...] = ()
    id_field: str | None = None

    @property
    def is_hub(self) -> bool:
        return self.kind == "hub"

    @property
    def is_local_path(self) -> bool:
        """Whether `hub_id` names a local dataset directory instead of a hub repository.

        Tests (and users with a mirror on disk) point a source at a local directory; a revision
        means nothing there, so it is neither passed to `datasets` nor recorded as a pin.
        """
        if self.hub_id is None:
            return False
        hub_id = self.hub_id
        return hub_id.startswith(("/", "./", "../", "~")) or Path(hub_id).expanduser().exists()

    def identity(self, instruction_text: str | None) -> dict[str, Any]:
        """What decides the content of the written file (stored in and compared with its meta)."""
        return {
            "kind": self.kind,
            "hub_id": self.hub_id,
            "config": self.config,
            "split": self.split,
            "revision": "local" if self.is_local_path else self.revision,
            "problem": self.problem,
            "answer": self.answer,
            "answer_rule": self.answer_rule,
            "keep": list(self.keep),
            "id_field": self.id_field,
            "instruction": instruction_text if self.instruction else None,
        }


def source_scale(source: Source) -> str:
    """`tiny` for the synthetic task, `paper` for hub datasets (the `--scale` filter)."""
    return "tiny" if source.kind == "synthetic" else "paper"


def data_root(data_cfg: DictConfig) -> Path:
    """The directory holding the prepared files (`data.root`, `~` expanded)."""
    try:
        root = data_cfg.root
    except Exception as err:  # e.g. an unresolvable interpolation
        raise ConfigError(f"data.root: {str(err).splitlines()[0]}; set data.root=/path or "
                          "HACRL_DATA") from None
    if not root:
        raise ConfigError("data.root is empty; set data.root=/path or HACRL_DATA")
    return Path(os.path.expanduser(str(root)))


def _key(name: str, key: str) -> str:
    return f"data.sources.{name}.{key}"


def _parse(name: str, entry: dict[str, Any]) -> Source:
    kind = entry.get("kind", "hub")
    if kind not in ("hub", "synthetic"):
        raise ConfigError(f"{_key(name, 'kind')}={kind}: use hub or synthetic")
    required = _HUB_REQUIRED if kind == "hub" else _SYNTHETIC_REQUIRED
    known = set(required) | set(_HUB_OPTIONAL if kind == "hub" else _SYNTHETIC_OPTIONAL)
    for key in entry:
        if key not in known:
            raise ConfigError(f"{_key(name, key)}: unknown key for a {kind} source; known keys: "
                              f"{', '.join(sorted(known))}")
    for key in required:
        if key != "kind" and entry.get(key) in (None, ""):
            raise ConfigError(f"{_key(name, key)}: missing; a {kind} source needs "
                              f"{', '.join(k for k in required if k != 'kind')}")

    rows = entry.get("rows")
    if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 1):
        raise ConfigError(f"{_key(name, 'rows')}={rows}: must be an integer >= 1")
    sha = entry.get("sha256")
    if sha is not None and (not isinstance(sha, str) or len(sha) != 64
                            or any(c not in "0123456789abcdef" for c in sha)):
        raise ConfigError(f"{_key(name, 'sha256')}={sha}: give 64 lowercase hex digits or null")
    instruction = entry.get("instruction", kind == "hub")
    if not isinstance(instruction, bool):
        raise ConfigError(f"{_key(name, 'instruction')}={instruction}: use true or false")

    if kind == "synthetic":
        from hacrl.data.arith import SPLITS

        split = str(entry["split"])
        if split not in SPLITS:
            raise ConfigError(f"{_key(name, 'split')}={split}: not a split of hacrl.data.arith; known: "
                              f"{', '.join(SPLITS)}")
        return Source(name=name, kind=kind, split=split, rows=rows, instruction=instruction,
                      sha256=sha)

    rule = entry.get("answer_rule", "field")
    if rule not in ANSWER_RULES:
        raise ConfigError(f"{_key(name, 'answer_rule')}={rule}: use one of "
                          f"{', '.join(ANSWER_RULES)}")
    keep = entry.get("keep") or []
    if isinstance(keep, str) or not all(isinstance(k, str) for k in keep):
        raise ConfigError(f"{_key(name, 'keep')}={keep}: give a list of field names")
    clash = [k for k in keep if k in BASE_FIELDS]
    if clash:
        raise ConfigError(f"{_key(name, 'keep')}: {', '.join(clash)} would overwrite a field "
                          f"every row has ({', '.join(BASE_FIELDS)}); drop it")
    config = entry.get("config")
    id_field = entry.get("id_field")
    return Source(
        name=name, kind=kind, split=str(entry["split"]), rows=rows, instruction=instruction,
        sha256=sha, hub_id=str(entry["hub_id"]), config=None if config is None else str(config),
        revision=str(entry["revision"]), problem=str(entry["problem"]),
        answer=str(entry["answer"]), answer_rule=rule, keep=tuple(keep),
        id_field=None if id_field is None else str(id_field),
    )


def load_sources(data_cfg: DictConfig) -> dict[str, Source]:
    """All sources of `data.sources`, validated (a bad entry raises `ConfigError`)."""
    raw = data_cfg.get("sources")
    if raw is None:
        raise ConfigError("data.sources: missing; the data catalog (experiments/data/"
                          "catalog.yaml) lists the sources")
    try:
        entries = OmegaConf.to_container(raw, resolve=True)
    except Exception as err:
        raise ConfigError(f"data.sources: {str(err).splitlines()[0]}") from None
    if not isinstance(entries, dict):
        raise ConfigError("data.sources: must map source names to their settings")
    sources: dict[str, Source] = {}
    for key, entry in entries.items():
        name = str(key)
        if not isinstance(entry, dict):
            raise ConfigError(f"data.sources.{name}: must be a mapping of settings")
        sources[name] = _parse(name, entry)
    return sources


def instruction_text(data_cfg: DictConfig) -> str:
    """The paper's instruction appended to the problems of hub sources."""
    text = data_cfg.get("instruction")
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("data.instruction: missing; give the sentence appended to problems")
    return text.strip()
