"""The sweep and its report: the manifest as a record, the table registry, the report the command
writes after a sweep (also when cells failed), a sweep without tables, a sweep never run, and
the layering (hacrl.sweep and analysis do not import each other)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from hacrl.config import compose
from hacrl.core.errors import ConfigError, HacrlError
from hacrl.schema.sweep_manifest import (
    CellRecord,
    MethodRecord,
    PairRecord,
    SweepManifest,
    read_manifest,
    write_manifest,
)
from hacrl.sweep.grid import SWEEP_DIR, expand, recorded_facts

ROOT = Path(__file__).resolve().parent.parent


# -- layering ------------------------------------------------------------------------------------


def _imports(folder: Path) -> dict[str, set[str]]:
    """Module file -> every module it imports, at any depth (function-level imports too)."""
    out: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
        out[str(path.relative_to(ROOT))] = names
    return out


@pytest.mark.parametrize(("package", "forbidden"), [("hacrl/sweep", "analysis"),
                                                    ("analysis", "hacrl.sweep")])
def test_sweep_and_analysis_do_not_import_each_other(package: str, forbidden: str) -> None:
    found = {f"{path}: {name}" for path, names in _imports(ROOT / package).items()
             for name in names if name == forbidden or name.startswith(f"{forbidden}.")}
    assert not found


def test_the_manifest_schema_is_a_leaf() -> None:
    names = _imports(ROOT / "hacrl" / "schema")["hacrl/schema/sweep_manifest.py"]
    leaves = ("hacrl.core.errors", "hacrl.core.fileio", "hacrl.core.layout", "hacrl.schema")  # test_layers' bottom
    foreign = {n for n in names if n.split(".")[0] not in sys.stdlib_module_names
               and not n.startswith(leaves)}
    assert not foreign


# -- the manifest --------------------------------------------------------------------------------


def test_manifest_round_trips_and_an_old_one_still_reads(tmp_path: Path) -> None:
    cell = CellRecord("abc123", ["pair=size"], "hacpo", ["a", "b"], 1, sweeps=["table2"],
                      protocols=["ablation"], params={"algo.alpha": 1.0})
    manifest = SweepManifest("table2", [cell], arguments=["scale=tiny"], asked=1,
                             tracking_uri="sqlite:///x", tables=["table2"], figures=[],
                             grids={"table2": [{"pair": "size"}]},
                             pairs={"size": PairRecord("a+b", "size", ["a", "b"])},
                             methods={"hacpo": MethodRecord(True), "base": MethodRecord(False, False)})
    write_manifest(tmp_path, manifest)
    back = read_manifest(tmp_path)
    assert back is not None and back.cells == [cell] and back.tables == ["table2"]
    assert back.format == 3 and back.created > 0 and back.grids == manifest.grids
    assert back.pairs == manifest.pairs and back.methods == manifest.methods
    # format 2 (before pairs and methods were recorded): they read as None
    data = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps(
        {**{k: v for k, v in data.items() if k not in ("pairs", "methods")}, "format": 2}))
    back = read_manifest(tmp_path)
    assert back is not None and back.format == 2 and (back.pairs, back.methods) == (None, None)
    # a record with a key this hacrl does not know is refused, naming it
    (tmp_path / "manifest.json").write_text(json.dumps(
        {**data, "pairs": {"size": {"name": "a+b", "setting": "size", "agents": [], "x": 1}}}))
    with pytest.raises(HacrlError, match=r"pairs.size: unknown key 'x'"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    # format 1 (before the report keys): no format, tables, figures or grids
    old = {k: v for k, v in json.loads((tmp_path / "manifest.json").read_text()).items()
           if k not in ("format", "tables", "figures", "grids")}
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    back = read_manifest(tmp_path)
    assert back is not None and back.format == 1 and back.cells == [cell]
    assert (back.tables, back.figures, back.grids) == (None, None, None)
    assert read_manifest(tmp_path / "nowhere") is None


# -- the registry --------------------------------------------------------------------------------


def test_tables_and_figures_are_registered_by_key() -> None:
    from analysis.builders import registered, unknown_keys
    from analysis.table_registry import TABLES, register_table, table_order

    tables, figures = registered()
    assert set(tables) == {"table1", "table2", "table3", "table4", "table5", "table6", "table7",
                           "table8", "table9", "alpha"}
    assert list(figures) == ["figure2", "figure3", "alpha", "schedules", "hacpo_dynamics",
                             "training_curves"]
    assert table_order(["alpha", "table9", "table4"]) == ["table4", "table9", "alpha"]
    assert unknown_keys(["table1", "table99"], ["figure2", "nope"]) == [
        ("tables", "table99", sorted(tables)), ("figures", "nope", sorted(figures))]

    def other(ctx: Any) -> Any:
        return None

    with pytest.raises(ValueError, match="'table1' is registered twice"):
        register_table("table1")(other)
    register_table("extra_test_table")(other)
    try:
        assert "extra_test_table" in tables
    finally:
        del TABLES["extra_test_table"]


def test_each_sweep_names_its_tables_and_paper_gets_the_union() -> None:
    from analysis.builders import FIGURES, TABLES
    from hacrl.cli.sweep_report import sweep_definition

    table1 = sweep_definition("table1")
    assert table1.tables == ["table1", "table4", "table5"]
    assert table1.figures == ["figure2", "hacpo_dynamics", "training_curves"]
    assert sweep_definition("figure3").tables == []
    paper = sweep_definition("paper")
    assert set(paper.tables) == set(TABLES) and set(paper.figures) == set(FIGURES)
    assert set(paper.grids) >= {"table1", "table2", "seeds", "cost", "alpha"}


def test_a_report_key_that_is_not_a_list_names_the_file(tmp_path: Path, sweep_file) -> None:
    from hacrl.cli.sweep_report import sweep_definition

    path = sweep_file(tmp_path, "odd", report="    report:\n      tables: table1\n")
    with pytest.raises(ConfigError, match=r"odd.yaml: hydra.sweeper.report.tables must be a list"):
        sweep_definition("odd", (tmp_path, SWEEP_DIR))
    path.write_text(path.read_text().replace("tables: table1", "tabels: [table1]"))
    with pytest.raises(ConfigError, match=r"odd.yaml: hydra.sweeper.report is a mapping"):
        sweep_definition("odd", (tmp_path, SWEEP_DIR))


def test_an_unknown_table_key_is_one_line_before_anything_runs(tmp_path: Path,
                                                              sweep_file) -> None:
    configs = tmp_path / "configs"
    path = sweep_file(configs / "sweep", "bad", report="    report:\n      tables: [table1, table99]\n")
    root = tmp_path / "out"
    env = {**os.environ, "HACRL_OUTPUTS": str(root)}
    script = Path(sys.executable).parent / "hacrl"
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "hacrl.cli"]
    out = subprocess.run([*cmd, "sweep", "bad", f"hydra.searchpath=[file://{configs}]",
                          f"output_root={root}"], env=env, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    (line,) = [ln for ln in out.stderr.splitlines() if ln.startswith("hacrl:")]
    assert str(path) in line and "'table99'" in line and "table1, table2" in line
    assert not (root / "mlflow.db").exists() and not (root / "sweeps").exists()


# -- the report after a sweep --------------------------------------------------------------------


class FakeRun:
    """What `run_sweep` sees of a `SweepRun`: it writes the manifest, then fails a cell."""

    def __init__(self, root: Path, tables: list[str], fail: bool = True) -> None:
        from hacrl.sweep.grid import all_grids

        self.name, self.dry_run, self.fail = "table2", False, fail
        self.root, self.tables, self.grids = root, tables, all_grids()
        self.manifest: SweepManifest | None = None
        self.first: Any = None

    def sweep_dirs(self) -> tuple[Path, ...]:
        return (SWEEP_DIR,)

    def execute(self) -> list[dict[str, Any]]:
        from hacrl.sweep.run import SweepFailed

        self.first = compose([f"output_root={self.root}"])
        cells = expand("table2", lambda o: compose([f"output_root={self.root}", *o])).cells
        self.manifest = SweepManifest("table2", list(cells), tracking_uri="sqlite:///x",
                                      tables=self.tables, figures=[], grids=self.grids,
                                      **recorded_facts(self.grids, compose))
        if self.fail:
            raise SweepFailed("1 of 2 cells did not finish")
        return []


def test_the_report_is_written_after_a_sweep_whose_cells_failed(new_output_root, capsys):
    from hacrl.cli.sweep_report import run_sweep

    root = new_output_root()
    run = FakeRun(root, ["table2"])
    with pytest.raises(SystemExit) as ended:
        run_sweep(run)  # type: ignore[arg-type]
    assert ended.value.code == 1
    assert (root / "reports" / "table2-tiny" / "tables" / "table2.csv").is_file()
    err = capsys.readouterr().err
    assert "[hacrl sweep] report:" in err and "Traceback" not in err
    # then the seed groups of the store's job runs (`analysis.seed_groups`): none here
    assert "[hacrl sweep] seed groups: no finished job runs to group" in err
    # the sweep's last line says what failed and what to do
    assert err.strip().splitlines()[-1] == (
        "[hacrl sweep] 1 of 2 cells did not finish; their logs say why (`hacrl status table2`), "
        "and this command run again runs them again")


def test_a_sweep_without_tables_says_so_in_one_line(new_output_root, capsys):
    from hacrl.cli.sweep_report import run_sweep

    root = new_output_root()
    assert run_sweep(FakeRun(root, [], fail=False)) == []  # type: ignore[arg-type]
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "no table" in ln]
    assert lines == ["[hacrl sweep] sweep table2: no table is registered for it; runs are in "
                     "MLflow sqlite:///x (`hacrl ui`, `hacrl plot METRIC`; a table is named in "
                     "its sweep file under hydra.sweeper.report.tables)"]
    assert not (root / "reports").exists()


# -- `hacrl report` of a sweep never run, and of an old manifest ---------------------------------


def _agent_run(root: Path, config_hash: str, model: str, value: float) -> None:
    from hacrl.tracking import Tracker

    tracker = Tracker(f"sqlite:///{root / 'mlflow.db'}", "hacrl-tiny")
    run = tracker.start_run("x", {"hacrl.kind": "agent", "config_hash": config_hash,
                                  "method": "hacpo", "model": model, "scale": "tiny"})
    tracker.log_metrics(run, {"eval/ablation/tiny_math500/acc": value}, 1)
    tracker.finish(run, "FINISHED")


def _report(root: Path, capsys: pytest.CaptureFixture[str]) -> str:
    from hacrl.cli.main import main

    assert main(["report", "table2", f"output_root={root}", "--no-mlflow"]) == 0
    assert "report of table2: 2 tables" in capsys.readouterr().out  # table2 and cost
    return (root / "reports" / "table2-tiny" / "tables" / "table2.csv").read_text()


def test_report_of_a_sweep_never_run_lists_its_cells_as_not_run(new_output_root, capsys):
    root = new_output_root()
    _agent_run(root, "0123456789ab", "qwen3-4b-base", 0.5)  # some other run: a store with runs
    csv = _report(root, capsys)
    assert "not run" in csv and "not in this sweep" not in csv


def test_report_reads_the_cells_of_an_old_manifest(new_output_root, capsys):
    root = new_output_root()
    cells = expand("table2", lambda o: compose([f"output_root={root}", *o])).cells
    hacpo = next(c for c in cells if c.method == "hacpo")
    hacpo.id = "0ldmanifest0"  # only the manifest knows this id: it must be read, not expanded
    (root / "sweeps" / "table2").mkdir(parents=True)
    (root / "sweeps" / "table2" / "manifest.json").write_text(json.dumps({  # format 1
        "sweep": "table2", "arguments": [], "created": 0, "asked": 2,
        "tracking_uri": f"sqlite:///{root / 'mlflow.db'}", "cells": [asdict(c) for c in cells]}))
    _agent_run(root, "0ldmanifest0", hacpo.agents[0], 0.4321)
    assert "0.4321" in _report(root, capsys)


def test_a_users_own_sweep_is_reported_from_its_search_path(new_output_root, tmp_path, capsys,
                                                            sweep_file):
    from hacrl.cli.main import main

    root = new_output_root()
    _agent_run(root, "0123456789ab", "qwen3-4b-base", 0.5)
    configs = tmp_path / "configs"
    sweep_file(configs / "sweep", "mine", methods="[gspo, hacpo]",
               report="    report:\n      tables: [table2]\n")
    assert main(["report", "mine", f"output_root={root}", "--no-mlflow"]) == 2
    assert "sweep 'mine': no sweeps/mine.yaml" in capsys.readouterr().err
    assert main(["report", "mine", f"hydra.searchpath=[file://{configs}]", f"output_root={root}",
                 "--no-mlflow"]) == 0
    assert "report of mine: 2 tables" in capsys.readouterr().out  # table2 and cost
    table = (root / "reports" / "mine-tiny" / "tables" / "table2.csv").read_text().splitlines()
    assert table[0].startswith("section,row,column,ours") and len(table) > 1
