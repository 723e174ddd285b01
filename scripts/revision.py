"""The code of another git revision of this repository, for benchmarks that compare old and new
side by side in one run (`bench_eval.py`, `bench_zoo.py`, `bench_sweep.py`)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def export_revision(rev: str, dest: Path, *paths: str) -> Path:
    """The files of revision `rev` (all, or only `paths`), written under `dest` (git archive);
    run them with PYTHONPATH=dest."""
    blob = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev, *paths],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(dest, filter="data")
    return dest
