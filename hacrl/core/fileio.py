"""Files written whole or not at all, and their hashes (leaf: the standard library only).

Every file hacrl writes that another process reads while it may be rewritten (DONE.json, sweep
state and manifest, prepared data) goes through `write_atomic`: a temporary file in the same
folder, renamed over the final name, so a reader or a crash never meets half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _umask() -> int:
    """The process's umask: Linux shows it in /proc; elsewhere set and set back (at import,
    before any thread of ours could create a file in between)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


def write_atomic(path: Path, content: str | Iterable[str]) -> None:
    """Write `content` (text, or pieces of it written in turn) to `path` through a temporary
    file beside it; the parent folder is made if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file owner-only; a shared output root's other users (`hacrl
        # status`, `hacrl report`) must read it as they read any file hacrl writes
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for piece in [content] if isinstance(content, str) else content:
                f.write(piece)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    """`data` as indented JSON, atomically (values JSON cannot hold are written as text)."""
    write_atomic(path, json.dumps(data, indent=1, default=str))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
