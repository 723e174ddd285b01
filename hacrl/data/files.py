"""Prepared files on disk: `<root>/<name>.jsonl` and its `<name>.meta.json`, and their checks.

The meta records where the rows came from and the sha256 of the jsonl, so a later reader can
tell a complete, untouched copy from a partial, edited or outdated one without the network.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hacrl.core.fileio import sha256_file
from hacrl.data.sources import Source

__all__ = ["LocalState", "data_path", "inspect", "meta_path", "read_meta"]

META_VERSION = 1


def data_path(root: Path, name: str) -> Path:
    return root / f"{name}.jsonl"


def meta_path(root: Path, name: str) -> Path:
    return root / f"{name}.meta.json"


def read_meta(root: Path, name: str) -> dict[str, Any] | None:
    try:
        meta = json.loads(meta_path(root, name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


@dataclass(frozen=True)
class LocalState:
    """What is on disk for one source. `status` is one of:

    ok (complete and matches the catalog), missing (no jsonl), no-meta, corrupt (sha256 or row
    count differs from its meta: edited or truncated), stale (intact, but prepared from other
    catalog settings or not the version the catalog pins).
    """

    path: Path
    status: str
    rows: int | None = None
    sha256: str | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def inspect(root: Path, source: Source, instruction: str) -> LocalState:
    """Check the prepared copy of `source` against its meta and the catalog (no network)."""
    path = data_path(root, source.name)
    if not path.is_file():
        return LocalState(path, "missing")
    meta = read_meta(root, source.name)
    if meta is None:
        return LocalState(path, "no-meta", detail=f"{meta_path(root, source.name)} is missing "
                          "or unreadable")
    sha = sha256_file(path)
    rows = _count_lines(path)
    if sha != meta.get("sha256"):
        return LocalState(path, "corrupt", rows, sha, "its sha256 differs from the one recorded "
                          "when it was prepared (edited or truncated)")
    if rows != meta.get("rows"):
        return LocalState(path, "corrupt", rows, sha, f"it has {rows} rows, its meta says "
                          f"{meta.get('rows')}")
    if source.sha256 and sha != source.sha256:
        # intact (it matches its own meta), but not the version the catalog pins now: prepared
        # by an older catalog or generator
        return LocalState(path, "stale", rows, sha, f"its sha256 {sha[:12]} is not the pinned "
                          f"data.sources.{source.name}.sha256 {source.sha256[:12]}")
    if source.rows is not None and rows != source.rows:
        return LocalState(path, "stale", rows, sha, f"it has {rows} rows, the catalog expects "
                          f"data.sources.{source.name}.rows={source.rows}")
    if meta.get("identity") != source.identity(instruction):
        return LocalState(path, "stale", rows, sha, "it was prepared from other catalog "
                          "settings (hub id, revision, fields or instruction)")
    return LocalState(path, "ok", rows, sha)
