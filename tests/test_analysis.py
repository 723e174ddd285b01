"""analysis/: a real MLflow store with runs of known values -> exact table cells, deltas, missing
reasons, mean ± std, claims, figures, the report folder and its MLflow run, `hacrl plot`."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.context import Context, Pair
from analysis.reference import BENCHMARKS
from analysis.report import build
from analysis.store import open_store
from analysis.tables_accuracy import benchmark_table, seeds_table
from analysis.tables_cost import runtime_table
from hacrl.config import ConfigError, compose
from hacrl.schema.sweep_manifest import CellRecord as Cell
from hacrl.schema.sweep_manifest import MethodRecord
from hacrl.sweep.grid import all_grids, pair_record, recorded_facts
from hacrl.tracking import Tracker

SIZE = Pair.of("size", pair_record("size", compose))           # qwen3-1.7b-base + qwen3-4b-base
LARGE = Pair.of("size_large", pair_record("size_large", compose))    # qwen3-4b-base + qwen3-8b-base
SMALL, BIG = SIZE.agents
# distinct per benchmark, so a value in the wrong column shows
OFFSETS = dict(zip(BENCHMARKS, (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06), strict=True))


def _cell(cid: str, method: str, agents: tuple[str, ...] | list[str], sweeps: list[str],
          seed: int = 0, /, **params: object) -> Cell:
    """A cell of `method`; `params` (names with dots passed as `**{...}`) over the defaults. The
    named arguments are positional-only: no key in `params` can land on them."""
    from hacrl.algo.methods import METHODS

    return Cell(cid, [], method, list(agents), seed, sweeps=sweeps, protocols=["main"],
                trains=METHODS[method].trains, scale="tiny",
                model_paths={a: f"/zoo/{a}" for a in agents},
                params={"algo.alpha": 1.0, "train.steps": 30, **params})


def _scores(base: float) -> dict[str, float]:
    """Both protocols (Table 1 reads `main`, the seeds table `ablation`)."""
    out = {f"eval/{p}/tiny_{b}/acc": base + off for b, off in OFFSETS.items()
           for p in ("main", "ablation")}
    return {**out, "eval/main/avg/acc": base + 0.03, "eval/ablation/avg/acc": base + 0.03}


def _curves(*keys: str) -> dict[str, list[tuple[int, float]]]:
    return {k: [(s, 0.5 + 0.01 * s) for s in range(1, 6)] for k in keys}


class Store:
    """Writes runs into a real sqlite MLflow store through hacrl's own Tracker."""

    def __init__(self, root: Path) -> None:
        self.uri = f"sqlite:///{root / 'mlflow.db'}"
        self.tracker = Tracker(self.uri, "hacrl")

    def run(self, kind: str, cell: str, method: str, model: str | None, metrics: dict,
            status: str = "FINISHED", history: dict | None = None,
            tags: dict[str, str] | None = None) -> str:
        all_tags = {"hacrl.kind": kind, "config_hash": cell, "method": method, "scale": "tiny",
                    **({"model": model} if model else {}), **(tags or {})}
        run_id = self.tracker.start_run(f"{method}:{model}", all_tags)
        for key, points in (history or {}).items():
            for step, value in points:
                self.tracker.log_metrics(run_id, {key: value}, step)
        if metrics:
            self.tracker.log_metrics(run_id, metrics, 30)
        if status != "RUNNING":
            self.tracker.finish(run_id, status)
        return run_id


@pytest.fixture()
def world(tmp_path: Path) -> tuple[Context, dict[str, str]]:
    """Table-1 cells of the size pair with every kind of outcome, and five hacpo seeds."""
    store = Store(tmp_path)
    ids: dict[str, str] = {}
    cells = [
        _cell("hacpo", "hacpo", SIZE.agents, ["table1", "seeds"]),
        _cell("x2s", "gspo_x2", [SMALL], ["table1"]), _cell("x2b", "gspo_x2", [BIG], ["table1"]),
        _cell("gspos", "gspo", [SMALL], ["table1"]), _cell("gspob", "gspo", [BIG], ["table1"]),
        _cell("grpos", "grpo", [SMALL], ["table1"]),
        _cell("bases", "base", [SMALL], ["table1"]),
        _cell("f3", "hacpo_no_clip", LARGE.agents, ["figure3"]),
        _cell("alpha0", "hacpo", SIZE.agents, ["alpha"], **{"algo.alpha": 0.0}),
        _cell("sched", "hacpo", SIZE.agents, ["schedules"], **{
            "algo.alpha": 3.0, "algo.cross_clip_lower": 0.9, "algo.delta_step": 0.01}),
        *[_cell(f"hacpo{s}", "hacpo", SIZE.agents, ["seeds"], s) for s in (1, 42)],
        # a timing cell of each method for Table 7 (one repeat)
        _cell("t_hacpo", "hacpo", SIZE.agents, ["cost"], timing_repeat=0),
        *[_cell(f"t_{m}_{a}", m, [a], ["cost"], timing_repeat=0)
          for m in ("gspo", "gspo_updates_x2", "gspo_x2") for a in SIZE.agents],
    ]
    for c in cells:
        if c.cost is False and c.id.startswith("t_"):
            c.cost = True
    val = "val/tiny_math500/acc"
    dynamics = _curves("capability/P", f"omega/{BIG}", "ratio/s_hete_mean", "ratio/s_hete_min",
                       "ratio/s_hete_max", "reward/mean", "response/length_mean")
    ids["hacpo_small"] = store.run("agent", "hacpo", "hacpo", SMALL, _scores(0.30),
                                   history={val: [(0, 0.2), (5, 0.25), (10, 0.3)], **dynamics})
    store.run("agent", "f3", "hacpo_no_clip", LARGE.agents[0], _scores(0.4),
              history=_curves(val))
    store.run("agent", "alpha0", "hacpo", SMALL, _scores(0.28))
    store.run("agent", "sched", "hacpo", BIG, _scores(0.52))
    store.run("agent", "hacpo", "hacpo", BIG, _scores(0.50), history={val: [(0, 0.4), (10, 0.5)]})
    ids["x2_small"] = store.run("agent", "x2s", "gspo_x2", SMALL, _scores(0.20),
                                history={val: [(0, 0.2), (10, 0.22)]})
    store.run("agent", "x2b", "gspo_x2", BIG, _scores(0.45))
    store.run("agent", "gspos", "gspo", SMALL, {}, status="FAILED")
    store.run("agent", "gspob", "gspo", BIG, _scores(0.40), status="KILLED")
    store.run("agent", "grpos", "grpo", SMALL, {}, status="RUNNING")
    store.run("eval", "", "base", SMALL, _scores(0.10),
              tags={"hacrl.model_path": f"/zoo/{SMALL}"})
    for seed, base in ((1, 0.34), (42, 0.26)):
        store.run("agent", f"hacpo{seed}", "hacpo", SMALL, _scores(base))
    for cid, wall in (("t_hacpo", 30.0), (f"t_gspo_x2_{SMALL}", 20.0),
                      (f"t_gspo_x2_{BIG}", 25.0), (f"t_gspo_{SMALL}", 10.0)):
        store.run("job", cid, cid, None, {"time/wall_s": wall})
    return Context(open_store(store.uri), cells, "tiny", all_grids(), **recorded_facts(all_grids(), compose)), ids


def _row(table, section: str, row: str) -> dict:
    for s, r, entries in table.rows:
        if (s, r) == (section, row):
            return dict(zip(table.columns, entries, strict=True))
    raise AssertionError(f"no row {section} / {row}: {[(s, r) for s, r, _ in table.rows]}")


def test_who_trained_together_comes_from_the_manifest(world) -> None:
    """The tables' pairs and teams are the manifest's record (`pairs`, `methods`), not the
    config tree's or the method registry's: a record that differs from both is what is used,
    and a pair the record lacks is one error naming it."""
    ctx, _ = world
    size = ctx.pairs["size"]
    renamed = replace(ctx, pairs={**ctx.pairs, "size": replace(size, name="as-recorded")})
    recorded_size = {p.key: p for p in renamed.pairs_of("table1")}["size"]
    assert (recorded_size.name, recorded_size.agents) == ("as-recorded", SIZE.agents)
    assert ctx.team("gspo", SIZE, SMALL) == [SMALL]
    shared = replace(ctx, methods={**ctx.methods, "gspo": MethodRecord(shares_rollouts=True)})
    assert shared.team("gspo", SIZE, SMALL) == list(SIZE.agents)
    with pytest.raises(ValueError, match=r"pair state \(sweeps/table1.yaml\) is not in the sweep.s manifest"):
        replace(ctx, pairs={}).pairs_of("table1")
    with pytest.raises(ValueError, match="method gspo is not in the sweep's manifest"):
        replace(ctx, methods={}).team("gspo", SIZE, SMALL)


def test_table1_cells_deltas_and_missing_reasons(world):
    ctx, ids = world
    table = benchmark_table(ctx, "table1", "Table 1", "table1", "table1_main")
    hacpo = _row(table, SIZE.name, f"{SMALL} · HACPO")
    cell = hacpo["MATH-500"]
    assert cell.ours.values == [pytest.approx(0.30)] and cell.ours.run_ids == [ids["hacpo_small"]]
    assert cell.paper == 0.69 and cell.delta == pytest.approx(0.30 - 0.69)
    assert hacpo["GSM8K"].ours.mean == pytest.approx(0.32) and hacpo["GSM8K"].paper == 0.822
    avg = hacpo["AVG"]
    assert avg.ours.mean == pytest.approx(0.33)           # mean of 0.30 .. 0.36
    # minus GSPOx2's 0.23; these runs logged no per-problem outcomes, so no interval
    assert avg.extra == "[+0.100, no samples]" and avg.interval is None
    assert "no samples" in avg.ours_text()
    paper_avg = statistics.fmean([0.69, 0.674, 0.822, 0.225, 0.45, 0.279, 0.314])
    assert avg.paper == pytest.approx(paper_avg)
    x2 = statistics.fmean([0.664, 0.65, 0.829, 0.177, 0.375, 0.265, 0.293])
    assert avg.paper_extra == f"[{paper_avg - x2:+.3f}]"
    assert "paper 0.690, Δ -0.390" in cell.paper_text()
    # why cells are empty
    assert _row(table, SIZE.name, f"{SMALL} · GSPO")["MATH-500"].ours.reason == "failed"
    assert _row(table, SIZE.name, f"{BIG} · GSPO")["AVG"].ours.reason == "killed"
    assert _row(table, SIZE.name, f"{BIG} · GSPO")["MATH"].ours.reason == "killed"
    assert _row(table, SIZE.name, f"{SMALL} · GRPO")["MATH"].ours.reason == "running"
    assert _row(table, SIZE.name, f"{SMALL} · Naive")["MATH"].ours.reason == "not in this sweep"
    assert _row(table, SIZE.name, f"{BIG} · Base")["MATH"].ours_text() == "— (not in this sweep)"
    base = _row(table, SIZE.name, f"{SMALL} · Base")["AMC23"]
    assert base.ours.mean == pytest.approx(0.14) and base.paper is not None
    # a pair with no cell at all is still listed, every cell saying why
    state = Pair.of("state", pair_record("state", compose))
    assert _row(table, state.name, f"{state.agents[0]} · HACPO")["AVG"].ours.mean is None
    frame = table.to_frame()
    assert set(frame[frame["missing"] != ""]["missing"]) >= {"failed", "running", "killed"}


def test_printed_avg_that_differs_is_shown_next_to_the_mean(world):
    ctx, _ = world
    table = benchmark_table(ctx, "table9", "Table 9", "table9", "table9_additional")
    avg = _row(table, LARGE.name, "qwen3-4b-base · HACPO")["AVG"]
    assert avg.paper == pytest.approx(statistics.fmean([0.81, 0.803, 0.904, 0.275, 0.6, 0.364,
                                                        0.463]))
    assert avg.paper_note == "printed 0.614"


def test_seeds_mean_and_sample_std(world):
    ctx, _ = world
    table = seeds_table(ctx)
    row = _row(table, SIZE.name, f"{SMALL} · HACPO")
    values = [0.30, 0.34, 0.26]  # seeds 0, 1, 42 (1337 and 3407 not run)
    summary = row["mean ± std"]
    assert summary.ours.values == pytest.approx(values)
    assert summary.ours.std == pytest.approx(statistics.stdev(values))  # ddof = 1
    assert summary.ours.reason == "2 of 5 not in this sweep"
    assert summary.paper == pytest.approx(0.6552) and summary.paper_note == "± 0.0072"
    assert row["seed 42"].ours.mean == pytest.approx(0.26) and row["seed 42"].paper == 0.664
    assert "0.3000 ± 0.0400 (n=3)" in summary.ours_text()
    # the mean's interval over seeds, ours and the paper's (from its five per-seed values),
    # kept in [0, 1]: with 2 df drawn towards 0.5 (the t interval: 0.2006 to 0.3994)
    assert summary.extra == "[95% CI 0.2115 to 0.4065]"
    assert summary.paper_extra == "[95% CI 0.6463 to 0.6640]"
    # paired by seed: HACPO − GSPOx2; the paper gives no per-seed GSPOx2 for the 4B agent
    diff = _row(table, SIZE.name, f"{SMALL} · HACPO − GSPOx2")
    assert diff["seed 42"].paper == pytest.approx(0.664 - 0.624)
    assert diff["mean ± std"].paper == pytest.approx(0.0308)
    assert "p 0.00031, MDE 0.0100 (5 seeds)" in diff["mean ± std"].paper_text()
    assert diff["mean ± std"].ours.reason == "5 of 5 not in this sweep"
    none = _row(table, SIZE.name, f"{BIG} · HACPO − GSPOx2")
    assert none["seed 0"].paper is None and none["mean ± std"].paper is None
    assert none["mean ± std"].paper_text() == "paper: no samples"
    assert _row(table, SIZE.name, f"{BIG} · GSPOx2")["mean ± std"].paper_extra == \
        "[95% CI: no samples]"


def test_runtime_sums_single_agent_baselines_over_both_agents(world):
    ctx, _ = world
    table = runtime_table(ctx)
    x2 = _row(table, SIZE.name, "GSPOx2")
    assert x2["total"].ours.mean == pytest.approx(45.0) and x2["total"].paper == 404
    hacpo = _row(table, SIZE.name, "HACPO")
    assert hacpo["total"].ours.mean == pytest.approx(30.0)
    ratio = hacpo["total / GSPOx2 total"]
    assert ratio.ours.mean == pytest.approx(30 / 45) and ratio.paper == pytest.approx(331 / 404)
    # one agent of GSPO never timed: no total, and the reason says so
    gspo = _row(table, SIZE.name, "GSPO")
    assert gspo[BIG].ours.reason == "not run" and gspo["total"].ours.mean is None


def test_report_folder_claims_figures_and_mlflow_run(world, tmp_path):
    from analysis.builders import FIGURES, TABLES
    from hacrl.cli.sweep_report import sweep_definition

    ctx, _ = world
    paper = sweep_definition("paper")  # every table and figure: paper includes all sweeps
    assert set(paper.tables) == set(TABLES) and set(paper.figures) == set(FIGURES)
    report = build(ctx, "paper", tmp_path / "report", paper.tables, paper.figures)
    assert list(report.tables) == ["table1", "table2", "table3", "table4", "table5", "table6",
                                   "table7", "table8", "table9", "alpha",
                                   "cost"]  # the paper's order, then what the sweep cost
    folder = report.folder
    for key in ("table1", "table6", "table7", "table9"):
        for suffix in ("md", "tex", "csv"):
            assert (folder / "tables" / f"{key}.{suffix}").stat().st_size > 0
    assert report.figures == list(FIGURES) and not report.undrawn  # each figure is produced
    for name in report.figures:
        assert (folder / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert b"<svg" in (folder / "figures" / f"{name}.svg").read_bytes()[:1000]
    page = (folder / "index.html").read_text()
    assert 'src="figures/figure2.png"' in page and "tiny scale" in page
    assert "not comparable to the paper" in page and "failed" in page
    claims = {c.text: c for c in report.claims}
    above = claims["HACPO is above GSPOx2 (AVG) for every agent of every Table-1 pair"]
    # no per-problem outcomes in this store: nothing is tested, the difference is still shown
    assert above.verdict == "not testable (runs missing)"
    assert above.paper_verdict.startswith("holds for 6 of 6 agents")
    assert "HACPO 0.330 vs GSPOx2 0.230 (+0.100)" in " ".join(above.details)
    cost = claims["HACPO takes less wall time than GSPOx2 (both agents)"]
    assert "ratio 0.67" in cost.details[0]
    assert cost.verdict.startswith("not testable (one repeat")  # one timing repeat each
    runs = (folder / "runs.csv").read_text()
    assert report.run_id and len(runs.splitlines()) > 10
    store = open_store(ctx.store.uri)
    (logged,) = store.select(**{"hacrl.kind": "report"})["run_id"]
    artifacts = {a.path for a in store.client.list_artifacts(logged, "report")}
    assert {"report/index.html", "report/figures", "report/tables"} <= artifacts


def test_plot_any_metric_by_a_tag(world, tmp_path):
    from analysis.plot import plot_metric

    ctx, _ = world
    files, drawn = plot_metric(ctx.store, "val/tiny_math500/acc", "method", [], tmp_path / "p")
    assert drawn == 4 and all(f.stat().st_size > 0 for f in files)  # runs with that curve
    with pytest.raises(ValueError, match="values present: .*hacpo"):
        plot_metric(ctx.store, "reward/mean", "method", ["method=hacpox"], tmp_path / "q")
    with pytest.raises(ValueError, match="not a tag or setting"):
        plot_metric(ctx.store, "reward/mean", "colour", [], tmp_path / "q")
    with pytest.raises(ValueError, match="none of the"):
        plot_metric(ctx.store, "no/such/metric", "method", [], tmp_path / "q")


def test_a_pairs_view_keeps_its_agents_single_agent_baselines(tmp_path):
    """`hacrl plot --pair size`: the pair's HACPO runs and its agents' GSPO runs (whose pair tag
    is the agent alone), not another pair's agent; `--where pair=...` would drop the GSPO runs."""
    from analysis.plot import pair_runs, plot_metric
    from analysis.store import open_store
    from hacrl.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "hacrl")
    small, big = SIZE.agents
    made = {}
    for method, model, pair_tag, setting in (
            ("hacpo", small, SIZE.name, "size"), ("hacpo", big, SIZE.name, "size"),
            ("gspo", small, small, "single"), ("gspo", big, big, "single"),
            ("gspo", "llama3.2-3b-instruct", "llama3.2-3b-instruct", "single"),
            ("hacpo", big, LARGE.name, "size_large")):
        run = tracker.start_run(f"{method}:{model}", {
            "hacrl.kind": "agent", "method": method, "model": model, "pair": pair_tag,
            "setting": setting, "scale": "tiny", "config_hash": f"{method}{pair_tag}"})
        tracker.log_steps(run, [(s, {"reward/mean": 0.1 * s}, 0) for s in (1, 2)])
        tracker.finish(run)
        made[(method, model, setting)] = run
    store = open_store(uri)
    picked = pair_runs(store.runs[store.runs["hacrl.kind"] == "agent"], SIZE)
    assert set(picked["run_id"]) == {made[("hacpo", small, "size")], made[("hacpo", big, "size")],
                                     made[("gspo", small, "single")], made[("gspo", big, "single")]}
    files, drawn = plot_metric(store, "reward/mean", "method", [], tmp_path / "pair", pair=SIZE)
    assert drawn == 4 and all(f.stat().st_size > 0 for f in files)
    with pytest.raises(ConfigError, match="pair=nope: no such option"):  # `hacrl plot --pair nope`
        pair_record("nope", compose)
