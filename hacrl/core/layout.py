"""Every path hacrl writes under the output root, in one place.

    <output_root>/
        mlflow.db, mlartifacts/          the default MLflow store (tracking.uri unset)
        runs/<config_hash>-<method>/     one job (`RunDir`): config.yaml, team-<i>/ (`TeamDir`)
        runs/.<config_hash>-<method>.lock    held while a process trains that job
        sweeps/<name>/                   one sweep (`SweepDir`): manifest, cell states, status
        reports/<sweep>-<scale>/         `hacrl report`
        reports/compare-<a>-vs-<b>/      `hacrl compare A B`
        plots/                           `hacrl plot`

The output root is resolved once (`Layout.at`: `~` expanded, absolute, symlinks resolved);
callers hold a `Layout` and ask it for paths instead of joining strings. What lies inside a
checkpoint step folder is the checkpoint format's business (`hacrl.checkpoint`).
Leaf module: standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TeamDir:
    """One team of a job: its checkpoints and the record that it finished."""

    path: Path

    @property
    def ckpt(self) -> Path:
        return self.path / "ckpt"

    @property
    def done(self) -> Path:
        return self.path / "DONE.json"


@dataclass(frozen=True)
class RunDir:
    """One training job's folder (named by its config hash and method)."""

    path: Path

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def checkpoint_location(self) -> Path:
        """A one-line file (logged with the job run) saying where the checkpoints are."""
        return self.path / "checkpoint_location.txt"

    @property
    def lock(self) -> Path:
        # beside the folder, not in it: the lock exists before the folder and outlives a wipe
        return self.path.parent / f".{self.path.name}.lock"

    def team(self, index: int) -> TeamDir:
        return TeamDir(self.path / f"team-{index}")

    def teams(self) -> list[TeamDir]:
        """The teams that exist on disk, in index order."""
        found = [p for p in self.path.glob("team-*") if p.name[5:].isdigit()]
        return [TeamDir(p) for p in sorted(found, key=lambda p: int(p.name[5:]))]


@dataclass(frozen=True)
class SweepDir:
    """One sweep's folder (`hydra.sweep.dir`): what it asked for and how each cell stands."""

    path: Path

    @property
    def manifest(self) -> Path:
        return self.path / "manifest.json"

    @property
    def status(self) -> Path:
        return self.path / "status.json"

    @property
    def submitit(self) -> Path:
        return self.path / ".submitit"

    def cell_state(self, cell_id: str) -> Path:
        return self.path / "cells" / f"{cell_id}.json"

    def cell_log(self, cell_id: str) -> Path:
        """The output of a warm cell (`hacrl.sweep.warm`), next to its state."""
        return self.path / "cells" / f"{cell_id}.log"


@dataclass(frozen=True)
class Layout:
    """The output root and everything under it."""

    root: Path

    @classmethod
    def at(cls, output_root: object) -> Layout:
        """The one place an `output_root` value becomes a path."""
        return cls(Path(os.path.expanduser(str(output_root))).resolve())

    @property
    def store_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def artifacts(self) -> Path:
        return self.root / "mlartifacts"

    def run(self, config_hash: str, method: str) -> RunDir:
        return RunDir(self.root / "runs" / f"{config_hash}-{method}")

    def evaluation_lock(self, model: str) -> Path:
        """The lock of every evaluation-only job of one model (its path or run id)."""
        import hashlib

        return self.root / "runs" / ".locks" / f"eval-{hashlib.sha256(model.encode()).hexdigest()[:16]}.lock"

    @property
    def sweeps(self) -> Path:
        """The folder of every sweep's folder."""
        return self.root / "sweeps"

    def sweep(self, name: str) -> SweepDir:
        return SweepDir(self.sweeps / name)

    def report(self, sweep: str, scale: str) -> Path:
        return self.root / "reports" / f"{sweep}-{scale}"

    def comparison(self, a: str, b: str) -> Path:
        """`hacrl compare A B`'s folder (`a`, `b`: the sides' labels, safe as file names)."""
        return self.root / "reports" / f"compare-{a}-vs-{b}"

    def plot(self, stem: str) -> Path:
        return self.root / "plots" / stem


def artifacts_beside(store_db: Path) -> Path:
    """A sqlite store's artifact folder: `mlartifacts/` next to the database file."""
    return store_db.parent / "mlartifacts"
