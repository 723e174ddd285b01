"""What A and B of `hacrl compare A B` are: the forms a side is given in (`parse_spec`,
`FORMS`), the checks on them, the labels the report uses, and a side once read (`Side`: its
manifest and store, seen at its commit by `at_commit`). Bad input is a `CompareError` (exit 2).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from analysis.store import Store
from hacrl.core.errors import HacrlError
from hacrl.core.layout import Layout
from hacrl.schema import tags as T
from hacrl.schema.sweep_manifest import FILE_NAME, SweepManifest

FORMS = ("a sweep folder (<output_root>/sweeps/NAME, holding its manifest.json), ROOT::NAME "
         "(sweep NAME under output root ROOT) or NAME (under the command's output_root), each "
         "optionally followed by @COMMIT (4-40 hex digits: only the runs made at a git commit "
         "starting with them)")
COMMIT_PREFIX = re.compile(r"[0-9a-fA-F]{4,40}")
_NAME = re.compile(r"[\w.-]+")


class CompareError(HacrlError):
    """Input `hacrl compare` cannot work with: one line naming it and the forms it takes."""

    exit_code = 2


@dataclass(frozen=True)
class SweepSpec:
    """One side as given: a sweep folder, and optionally a commit prefix its runs must have."""

    text: str                    # as typed
    folder: Path                 # <root>/sweeps/<name>
    commit: str | None = None    # lower-case hex prefix of the runs' git commit

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def label(self) -> str:
        return self.name + (f"@{self.commit}" if self.commit else "")


def parse_spec(text: str, output_root: Path | str, side: str) -> SweepSpec:
    """`text` as a sweep (see `FORMS`); `side` ("A" or "B") names it in errors."""
    body, commit = text, None
    if "@" in text and not Path(os.path.expanduser(text)).is_dir():
        body, _, commit = text.rpartition("@")
        if not body or not COMMIT_PREFIX.fullmatch(commit):
            raise CompareError(f"{side}={text!r}: @{commit} is not a commit prefix; {side} is "
                               f"{FORMS}")
        commit = commit.lower()
    if "::" in body:
        root, _, name = body.partition("::")
        if not root or not _NAME.fullmatch(name):
            raise CompareError(f"{side}={text!r} is not a sweep; {side} is {FORMS}")
        folder = Layout.at(root).sweep(name).path
    elif "/" in body or body.startswith((".", "~")):
        folder = Path(os.path.expanduser(body)).resolve()
    elif _NAME.fullmatch(body):
        folder = Layout.at(output_root).sweep(body).path
    else:
        raise CompareError(f"{side}={text!r} is not a sweep; {side} is {FORMS}")
    return SweepSpec(text, folder, commit)


def check_folder(spec: SweepSpec, side: str) -> None:
    """The folder exists and holds a manifest (CompareError otherwise, naming what to pass)."""
    if not spec.folder.is_dir():
        raise CompareError(f"{side}={spec.text!r}: no sweep folder {spec.folder}; run the sweep "
                           "first, or name the folder it ran in (ROOT::NAME, or output_root=...)")
    if not (spec.folder / FILE_NAME).is_file():
        raise CompareError(f"{side}={spec.text!r}: {spec.folder} holds no {FILE_NAME}, so it is "
                           f"not a sweep's folder; {side} is {FORMS}")


def labels(a: SweepSpec, b: SweepSpec) -> tuple[str, str]:
    """Names of the two sides for titles and the report folder (safe as file names)."""
    if a.folder == b.folder and a.commit == b.commit:
        raise CompareError(f"A={a.text!r} and B={b.text!r} are the same runs: compare two sweeps, "
                           "or one sweep at two commits (NAME@COMMIT)")
    la, lb = a.label, b.label
    if la == lb:  # the same sweep name in two output roots
        la, lb = f"{a.folder.parent.parent.name}.{la}", f"{b.folder.parent.parent.name}.{lb}"
    if la == lb:
        la, lb = f"{la}-a", f"{lb}-b"
    return _safe(la), _safe(lb)


def _safe(text: str) -> str:
    return re.sub(r"[^\w.@-]+", "_", text)


@dataclass
class Side:
    """One side, read: its spec, the sweep's record and the store its runs are in."""

    spec: SweepSpec
    manifest: SweepManifest
    store: Store
    label: str = ""

    def runs(self) -> Store:
        """The store as this side sees it: only the runs at its commit, if it names one."""
        return at_commit(self.store, self.spec.commit)


def at_commit(store: Store, commit: str | None) -> Store:
    """`store` with only the runs whose git commit starts with `commit` (the job's `git_commit`
    tag, else MLflow's source commit: an evaluation run carries only that one)."""
    if not commit:
        return store
    runs = store.runs
    own = runs[T.GIT_COMMIT].fillna("").astype(str)
    source = runs[T.SOURCE_COMMIT].fillna("").astype(str)
    made = own.where(own != "", source).str.lower()
    return replace(store, runs=runs[made.str.startswith(commit)])
