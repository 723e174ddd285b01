"""`prepare`: download each source once, convert it, check it and write it locally.

Hub sources go through `datasets.load_dataset(hub_id, name=config, split=split,
revision=revision)`; synthetic sources are drawn from `hacrl.data.arith`. A source is written only when
its row count (and pinned sha256, if any) is right, so a file under the final name is always a
complete, checked copy. Training and evaluation then read only these local files.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hacrl.core.errors import ConfigError
from hacrl.core.fileio import write_atomic
from hacrl.data.convert import convert_rows, synthetic_rows
from hacrl.data.files import META_VERSION, data_path, inspect, meta_path
from hacrl.data.sources import (
    DataError,
    HubUnreachable,
    Source,
    data_root,
    instruction_text,
    load_sources,
)

__all__ = ["PrepareResult", "prepare", "prepare_source", "select_sources"]


@dataclass(frozen=True)
class PrepareResult:
    """One prepared source: `status` is "written" or "skipped" (already prepared and valid)."""

    name: str
    path: Path
    rows: int
    sha256: str
    status: str


def select_sources(data_cfg: DictConfig, names: list[str] | None = None,
                   scale: str | None = None) -> list[Source]:
    """The named sources (default: all), optionally only those of one scale (tiny / paper)."""
    from hacrl.data.sources import source_scale

    sources = load_sources(data_cfg)
    if names:
        unknown = [n for n in names if n not in sources]
        if unknown:
            raise ConfigError(f"data source {', '.join(unknown)}: not in data.sources; known: "
                              f"{', '.join(sources)}")
        chosen = [sources[n] for n in dict.fromkeys(names)]
    else:
        chosen = list(sources.values())
    if scale is not None:
        if scale not in ("tiny", "paper"):
            raise ConfigError(f"scale={scale}: use tiny or paper")
        chosen = [s for s in chosen if source_scale(s) == scale]
    return chosen


def _is_network_error(err: BaseException) -> bool:
    """Whether `datasets` failed because the hub could not be reached (not a wrong id)."""
    if isinstance(err, ConnectionError | TimeoutError):  # incl. huggingface_hub's offline mode
        return True
    name = type(err).__name__
    if name in ("LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectError",
                "ConnectTimeout", "ReadTimeout"):
        return True
    return "Couldn't reach" in str(err)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def load_hub_rows(source: Source) -> list[dict[str, Any]]:
    """All rows of a hub split (or of a local dataset directory), as dicts."""
    import datasets

    assert source.hub_id is not None
    kwargs: dict[str, Any] = {"name": source.config, "split": source.split}
    if source.is_local_path:
        # `datasets` silently ignores a revision for local paths; leave it out so nothing looks
        # pinned that is not.
        path = str(Path(source.hub_id).expanduser())
    else:
        path = source.hub_id
        kwargs["revision"] = source.revision
    try:
        dataset = datasets.load_dataset(path, **kwargs)
    except Exception as err:
        config = f"config {source.config}, " if source.config else ""
        where = (f"data.sources.{source.name}: cannot load {source.hub_id} ({config}split "
                 f"{source.split}, revision {source.revision})")
        if _is_network_error(err):
            raise HubUnreachable(
                f"{where}: the Hugging Face hub is unreachable ({_first_line(err)}); "
                "`hacrl data prepare` needs the hub (or HF_ENDPOINT pointing at a mirror; "
                f"HF_HUB_OFFLINE must be unset), or copy a prepared {source.name}.jsonl and "
                f"{source.name}.meta.json into data.root"
            ) from None
        raise DataError(f"{where}: {type(err).__name__}: {_first_line(err)}") from None
    return [dict(row) for row in dataset]


def _rows_for(source: Source, instruction: str) -> list[dict[str, Any]]:
    if source.kind == "synthetic":
        return synthetic_rows(source, instruction)
    return convert_rows(source, load_hub_rows(source), instruction)


def prepare_source(source: Source, root: Path, instruction: str,
                   force: bool = False) -> PrepareResult:
    """Prepare one source under `root` (skipped when a valid copy is there and not `force`)."""
    state = inspect(root, source, instruction)
    if state.ok and not force:
        assert state.rows is not None and state.sha256 is not None
        return PrepareResult(source.name, state.path, state.rows, state.sha256, "skipped")

    rows = _rows_for(source, instruction)
    if source.rows is not None and len(rows) != source.rows:
        origin = source.hub_id or f"hacrl.data.arith split {source.split}"
        raise DataError(f"data.sources.{source.name}.rows={source.rows}: {origin} gave "
                        f"{len(rows)} rows; nothing written (a different revision or split? fix "
                        "the catalog if the change is expected)")
    lines = [json.dumps(row, ensure_ascii=False) + "\n" for row in rows]
    sha = hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()
    if source.sha256 and sha != source.sha256:
        raise DataError(f"data.sources.{source.name}.sha256={source.sha256[:12]}...: the converted "
                        f"rows hash to {sha}; nothing written (the data or the conversion "
                        "changed; update the pin only if that is intended)")

    path = data_path(root, source.name)
    # Drop the old meta first: a crash between the two writes then leaves a file without meta
    # (re-prepared next time), never a new file described by an old meta.
    meta_path(root, source.name).unlink(missing_ok=True)
    write_atomic(path, lines)
    meta = {
        "format": META_VERSION,
        "name": source.name,
        "kind": source.kind,
        "hub_id": source.hub_id,
        "config": source.config,
        "split": source.split,
        "revision": "local" if source.is_local_path else source.revision,
        "rows": len(rows),
        "sha256": sha,
        "instruction": source.instruction,
        "prepared_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "identity": source.identity(instruction),
    }
    write_atomic(meta_path(root, source.name), [json.dumps(meta, indent=2) + "\n"])
    return PrepareResult(source.name, path, len(rows), sha, "written")


def prepare(data_cfg: DictConfig, names: list[str] | None = None,
            force: bool = False) -> list[PrepareResult]:
    """Prepare the named sources (default: all) under `data.root`; the first failure raises."""
    root = data_root(data_cfg)
    instruction = instruction_text(data_cfg)
    return [prepare_source(s, root, instruction, force) for s in select_sources(data_cfg, names)]
