"""Between a sweep and its report: the command line's part.

`hacrl.sweep` (expand, launch, the manifest) and `analysis` (tables, figures, claims from the
MLflow store) do not import each other; this module, on top of both, connects them:

- before a sweep runs, the report keys its files name (`hydra.sweeper.report`) are checked
  against the tables and figures `analysis` registered;
- after it ran (also when some cells failed), the report is made from the manifest it wrote;
  a sweep whose files name no table says so in one line instead; then the seed groups of the
  store's job runs are written (`write_seed_groups`, also by `hacrl report`);
- `hacrl report <sweep>` gets the sweep's record here: its manifest's cells when it ran at this
  scale, else a fresh expansion of sweeps/<sweep>.yaml (a sweep never run lists its cells as
  `not run`), with the tables, figures and grids of the sweep files as they are now, and the
  pairs they name as this command line composes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hacrl.config import ConfigError
from hacrl.core.layout import Layout
from hacrl.schema.sweep_manifest import SweepManifest
from hacrl.sweep.grid import (
    SWEEP_DIR,
    all_grids,
    expand,
    load_report_keys,
    recorded_facts,
)
from hacrl.sweep.state import read_rebased_manifest

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from hacrl.sweep.run import SweepRun


@dataclass
class Definition:
    """What a sweep's files name for its report, checked against the registry."""

    tables: list[str]
    figures: list[str]
    grids: dict[str, list[dict[str, Any]]]


def sweep_definition(name: str, dirs: tuple[Path, ...] = (SWEEP_DIR,)) -> Definition:
    """The tables and figures sweep `name` and its includes name (each key once, first named
    first), and every sweep file's grids; a key no builder is registered for is one
    ConfigError naming the file, the key and the registered choices."""
    from analysis.builders import unknown_keys

    keys = load_report_keys(name, dirs)
    for named in keys:
        if unknown := unknown_keys(named.tables, named.figures):
            kind, key, choices = unknown[0]
            raise ConfigError(f"{named.file}: hydra.sweeper.report.{kind}: {key!r} is not a "
                              f"registered {kind[:-1]}; choose from {', '.join(choices)} (or "
                              "register a builder in analysis/, see analysis/table_registry.py)")
    return Definition(list(dict.fromkeys(t for k in keys for t in k.tables)),
                      list(dict.fromkeys(f for k in keys for f in k.figures)), all_grids(dirs))


def no_table_line(record: SweepManifest, uri: str) -> str | None:
    """The one line for a sweep that names no table or figure (None when it names some)."""
    if record.tables or record.figures:
        return None
    return (f"sweep {record.sweep}: no table is registered for it; runs are in MLflow {uri} "
            f"(`hacrl ui`, `hacrl plot METRIC`; a table is named in its sweep file under "
            "hydra.sweeper.report.tables)")


def run_sweep(run: SweepRun) -> list[dict[str, Any]]:
    """Check the sweep's report keys, run it, then write its report (also when cells failed:
    the report is written, then the sweep ends with one line and exit code 1, not a
    traceback). A report that cannot be made is said and does not change the sweep's outcome."""
    from hacrl.sweep.run import SweepFailed, say

    sweep_definition(run.name, run.sweep_dirs())  # an unknown key: before anything runs
    try:
        rows = run.execute()
    except SweepFailed as err:
        _report_after(run)
        say(f"{err}; their logs say why (`hacrl status {run.name}`), and this command run "
            "again runs them again")
        raise SystemExit(1) from None
    _report_after(run)
    return rows


def _report_after(run: SweepRun) -> None:
    from hacrl.sweep.run import say
    from hacrl.tracking.mlflow_store import resolve_uri

    manifest, cfg = run.manifest, run.first
    if run.dry_run or manifest is None or cfg is None:
        return
    _write_report(run, manifest, cfg)
    say(write_seed_groups(resolve_uri(cfg.tracking.uri, Layout.at(cfg.output_root).root),
                          str(cfg.tracking.experiment)))


def write_seed_groups(uri: str, experiment: str) -> str:
    """The seed groups of the store's job runs written into it (`analysis.seed_groups`; runs
    from before the seed_group tag placed by their params, `hacrl.config.seed_group_of_logged`),
    as one line; a store that cannot be written is said in it (the runs are safe)."""
    from analysis.seed_groups import update_seed_groups
    from hacrl.config import seed_group_of_logged
    from hacrl.core.errors import HacrlError, one_line

    try:
        return update_seed_groups(uri, experiment, seed_group_of_logged).line()
    except Exception as err:  # the runs are safe in MLflow; `hacrl report` writes them again
        why = str(err) if isinstance(err, HacrlError) else f"{type(err).__name__}: {one_line(err)}"
        return f"seed groups not written to MLflow ({why}); `hacrl report` writes them"


def _write_report(run: SweepRun, manifest: SweepManifest, cfg: DictConfig) -> None:
    from hacrl.sweep.run import say

    if line := no_table_line(manifest, manifest.tracking_uri):
        say(line)
        return
    from analysis.report import make_report

    try:  # the cells' own (Hydra cannot compose again inside its app)
        report = make_report(manifest, cfg)
    except Exception as err:  # the runs are safe in MLflow; `hacrl report` can retry
        say(f"report not written ({type(err).__name__}: {err}); run `hacrl report "
            f"{run.name}` with the same overrides")
        return
    say(f"report: {report.folder / 'index.html'} ({len(report.tables)} tables, "
        f"{len(report.figures)} figures, {report.seconds:.1f} s; MLflow run {report.run_id})")


def report_record(name: str, overrides: list[str], cfg: DictConfig,
                  dirs: tuple[Path, ...] = (SWEEP_DIR,)) -> SweepManifest:
    """The record `hacrl report` makes sweep `name`'s report from: the manifest's cells when
    that sweep ran at this scale and zoo draw under this output root, else a fresh expansion."""
    from hacrl.config import compose, zoo_seed

    definition = sweep_definition(name, dirs)
    manifest = read_rebased_manifest(Layout.at(cfg.output_root).sweep(name).path)
    cells = manifest.cells if manifest else []
    if not (manifest and manifest.sweep == name and cells and all(c.params for c in cells)
            and all(c.scale == str(cfg.scale.name) and c.zoo_seed == (zoo_seed(cfg) or 0)
                    for c in cells)):
        cells = list(expand(name, lambda extra: compose([*overrides, *extra]), dirs).cells)
    return SweepManifest(sweep=name, cells=cells, arguments=overrides,
                         tracking_uri=manifest.tracking_uri if manifest else "",
                         tables=definition.tables, figures=definition.figures,
                         grids=definition.grids,
                         **recorded_facts(definition.grids,
                                          lambda extra: compose([*overrides, *extra])))
