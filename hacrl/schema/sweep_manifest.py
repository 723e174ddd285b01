"""The sweep manifest: what `hacrl sweep` decided, written before any job starts, read by the
report (and by `hacrl status`). Leaf module: the standard library and the other leaves only.

<output_root>/sweeps/<name>/manifest.json is one JSON object:

    format        3 (format 2 lacks `pairs` and `methods`, format 1 also `tables`, `figures`
                  and `grids`; an older manifest still reads, what it lacks is then None)
    sweep         the sweep's name (sweeps/<name>.yaml)
    arguments     the command line's overrides
    created       when it was written (seconds since the epoch)
    asked         cells the grids asked for, before equal cells were merged
    tracking_uri  the MLflow store the cells log to
    cells         one object per distinct cell: the fields of `CellRecord`
    tables        report keys of the tables the sweep feeds (its file and the files it
                  includes name them under hydra.sweeper.report.tables)
    figures       report keys of its figures (hydra.sweeper.report.figures)
    grids         sweep name -> that sweep's own grids (the axes the tables are laid out by:
                  pairs, methods, protocols, settings), for every sweep file known to the sweep
    pairs         pair option (the grids' `pair` values) -> its name, setting and agents, as
                  the sweep composed it: who trains together in the report's tables
    methods       method name -> whether it shares rollouts (one job trains the whole team)
                  and trains at all, for every registered method

A cell is found in the store by `id` (the training config hash, MLflow tag `config_hash`), a
base model's evaluation by `model_paths`; `params` hold the resolved settings the tables place
cells by (alpha, clip schedule, steps, timing repeat, threads). Keys this module does not know
are refused in a cell (the manifest is from another hacrl) and ignored at the top level.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from hacrl.core.errors import HacrlError
from hacrl.core.fileio import write_json
from hacrl.core.layout import SweepDir

FORMAT = 3
FILE_NAME = SweepDir(Path()).manifest.name  # for messages about a manifest of unknown folder


@dataclass
class CellRecord:
    """One distinct training (or, for method=base, evaluation-only) job of a sweep."""

    id: str                            # the training config hash (`hacrl.config.config_hash`)
    overrides: list[str]               # what makes this cell (besides the sweep's command line)
    method: str
    agents: list[str]
    seed: int
    sweeps: list[str] = field(default_factory=list)     # the sweeps whose grids asked for it
    protocols: list[str] = field(default_factory=list)  # evaluation protocols it needs
    cost: bool = False                 # a timing cell: runs alone, after the others
    estimate: float = 1.0              # relative cost, for scheduling longest first
    # facts for deciding "done" without composing again (filled from the resolved config)
    trains: bool = True                # False: evaluation only (method=base)
    run_dir: str = ""
    model_paths: dict[str, str] = field(default_factory=dict)    # agent -> model path or hub id
    protocol_keys: dict[str, str] = field(default_factory=dict)  # protocol -> settings hash
    # benchmarks its evaluations cover (names as logged); [] (manifests before it): all of them
    benchmarks: list[str] = field(default_factory=list)
    scale: str = ""
    zoo_seed: int = 0                  # the tiny zoo's draw (`scale.zoo_seed`); 0 without a zoo
    # resolved settings a report needs even when the cell has no run yet
    params: dict[str, Any] = field(default_factory=dict)
    # its work in the cost model's units (`hacrl.sweep.cost_model.cell_work`); {} before them
    work: dict[str, float] = field(default_factory=dict)
    gpus: int = 0                      # GPUs its job holds (0 on a CPU)


@dataclass(frozen=True)
class PairRecord:
    """A pair option as the sweep composed it (experiments/pair/<key>.yaml and overrides)."""

    name: str            # e.g. "qwen3-1.7b-base+qwen3-4b-base" (the paper CSVs' `pair`)
    setting: str         # e.g. "size"
    agents: list[str]


@dataclass(frozen=True)
class MethodRecord:
    """What the report needs of a registered method (`hacrl.algo.METHODS`)."""

    shares_rollouts: bool  # one job trains the whole team on its pooled rollouts
    trains: bool = True


@dataclass
class SweepManifest:
    sweep: str
    cells: list[CellRecord]
    arguments: list[str] = field(default_factory=list)
    asked: int = 0
    tracking_uri: str = ""
    created: float = 0.0
    tables: list[str] | None = None    # None: not recorded (format 1)
    figures: list[str] | None = None
    grids: dict[str, list[dict[str, Any]]] | None = None
    pairs: dict[str, PairRecord] | None = None      # None: not recorded (format <= 2)
    methods: dict[str, MethodRecord] | None = None
    format: int = FORMAT


def manifest_path(sweep_dir: Path) -> Path:
    return SweepDir(sweep_dir).manifest


def write_manifest(sweep_dir: Path, manifest: SweepManifest) -> None:
    """Write `manifest` into the sweep folder atomically (a reader never sees half a file)."""
    data = asdict(manifest)
    data["created"] = manifest.created or time.time()
    write_json(manifest_path(sweep_dir), data)


def read_manifest(sweep_dir: Path) -> SweepManifest | None:
    """The sweep folder's manifest; None when there is none, or (with a warning) when the file
    is not a JSON object. A cell with unknown keys or wrong types is one HacrlError."""
    path = manifest_path(sweep_dir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        print(f"hacrl: warning: {path} is not a hacrl state file (damaged?); ignored",
              file=sys.stderr, flush=True)
        return None
    return from_json(data, path)


def from_json(data: dict[str, Any], path: Path | str = FILE_NAME) -> SweepManifest:
    """A manifest from its JSON object (format 1 or 2); `path` names it in errors."""
    again = f"run `hacrl sweep {data.get('sweep', '<name>')}` again to rewrite it"
    known = {f.name for f in fields(CellRecord)}
    try:
        cells = []
        for cell in data.get("cells") or []:
            if unknown := set(cell) - known:
                raise HacrlError(f"{path} is not a manifest of this hacrl (unknown key "
                                 f"{sorted(unknown)[0]!r}); {again}")
            cells.append(CellRecord(**cell))
        return SweepManifest(
            sweep=str(data.get("sweep", "")), cells=cells,
            arguments=[str(a) for a in data.get("arguments") or []],
            asked=int(data.get("asked") or 0), tracking_uri=str(data.get("tracking_uri", "")),
            created=float(data.get("created") or 0.0),
            tables=_names(data.get("tables")), figures=_names(data.get("figures")),
            grids=_grids(data.get("grids")),
            pairs=_records(data.get("pairs"), PairRecord, "pairs"),
            methods=_records(data.get("methods"), MethodRecord, "methods"),
            format=int(data.get("format") or 1))
    except (TypeError, AttributeError, ValueError) as err:
        raise HacrlError(f"{path} is damaged ({err}); {again}") from err


def _records(value: Any, kind: type, what: str) -> dict[str, Any] | None:
    """`what`: key -> a `kind` record from its JSON object (None when not recorded)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise TypeError(f"{what}: expected name -> object")
    known = {f.name for f in fields(kind)}
    for key, record in value.items():
        if unknown := set(record) - known:
            raise TypeError(f"{what}.{key}: unknown key {sorted(unknown)[0]!r}")
    return {str(k): kind(**v) for k, v in value.items()}


def _names(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise TypeError(f"expected a list of names, got {value!r}")
    return [str(v) for v in value]


def _grids(value: Any) -> dict[str, list[dict[str, Any]]] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
            isinstance(g, list) and all(isinstance(x, dict) for x in g) for g in value.values()):
        raise TypeError("grids: expected sweep name -> list of grids")
    return {str(k): v for k, v in value.items()}
