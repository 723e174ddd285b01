"""`hacrl compare A B`: pairing, the statistics' verdicts, the exit decision, and real sweeps.

The real part runs two small sweeps of the micro zoo that differ in one setting (`algo.alpha=1`
vs `algo.alpha=2`; B has one more seed, and a GSPO cell alpha does not reach, so both sweeps
share its runs). A regression is planted by rewriting B's logged outcomes in a copy of the
output root (B's runs then answer wrong, on every seed, the GSM8K problems A solved on every
seed); the reasons a cell is not compared are planted likewise (a run marked failed, an outcomes
file removed, one cut short). The commit form runs one sweep at two commits: the first sweep's
runs are tagged with another commit and two of its cells trained again.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import compare as C
from analysis.compare_page import verdict_text
from analysis.compare_pairing import pair_cells
from analysis.compare_runs import RunPicker
from analysis.compare_sides import COMMIT_PREFIX, FORMS, CompareError, Side, SweepSpec, parse_spec
from hacrl.schema.sweep_manifest import CellRecord, SweepManifest, read_manifest, write_manifest

AGENTS = ("qwen3-1.7b-base", "qwen3-4b-base")
BENCHMARKS = ("tiny_gsm8k", "tiny_aime2025")
OLD_COMMIT = "0123abcd" * 5


# -- pairing, on records made here ----------------------------------------------------------------

def _cell(id_: str, method: str, seed: int, *extra: str, agents: tuple[str, ...] = AGENTS,
          cost: bool = False) -> CellRecord:
    split = [f"agents=[{','.join(agents)}]"] if len(agents) == 1 else []
    return CellRecord(id_, ["pair=size", f"method={method}", f"seed={seed}", *split, *extra],
                      method, list(agents), seed, cost=cost)


def _manifest(name: str, cells: list[CellRecord], *arguments: str) -> SweepManifest:
    return SweepManifest(sweep=name, cells=cells,
                         arguments=[f"+sweep={name}", "output_root=/x", *arguments])


def test_cells_pair_by_identity_less_what_differs_between_the_sweeps() -> None:
    a = _manifest("a", [
        _cell("a0", "hacpo", 0, "train.steps=50"), _cell("a1", "hacpo", 1, "train.steps=50"),
        _cell("a2", "hacpo", 0, "train.steps=50", "algo.delta_step=0.1"),
        _cell("g0", "gspo", 0, "train.steps=50", agents=AGENTS[:1]),
        _cell("t0", "hacpo", 0, "train.steps=50", "timing_repeat=0", cost=True)],
        "algo.alpha=1", "train.lr=0.001")
    b = _manifest("b", [
        _cell("b0", "hacpo", 0, "train.steps=100"), _cell("b2", "hacpo", 2, "train.steps=100"),
        _cell("b3", "hacpo", 0, "train.steps=100", "algo.delta_step=0.2"),
        _cell("g1", "gspo", 0, "train.steps=100", agents=AGENTS[1:])],
        "algo.alpha=2", "train.lr=0.001")
    pairing = pair_cells(a, b)
    # the command line's alpha, and train.steps, which every grid cell of each sweep sets alike
    assert pairing.differs == ["algo.alpha: 1 -> 2 (command line)",
                               "train.steps: 50 -> 100 (grids)"]
    groups = {(key.label, key.agents): ({s: c.id for s, c in ia.items()},
                                         {s: c.id for s, c in ib.items()})
              for key, (ia, ib) in pairing.groups.items()}
    # delta_step differs cell by cell: part of the identity, so 0.1 and 0.2 never pair; the
    # GSPO cells are of different agents
    assert groups == {("hacpo pair=size", AGENTS): ({0: "a0", 1: "a1"}, {0: "b0", 2: "b2"}),
                      ("hacpo algo.delta_step=0.1 pair=size", AGENTS): ({0: "a2"}, {}),
                      ("hacpo algo.delta_step=0.2 pair=size", AGENTS): ({}, {0: "b3"}),
                      ("gspo pair=size", AGENTS[:1]): ({0: "g0"}, {}),
                      ("gspo pair=size", AGENTS[1:]): ({}, {0: "g1"})}
    reasons = {(u.what, u.reason) for u in pairing.unpaired}
    assert ("hacpo pair=size seed 1", "only in A") in reasons
    assert ("hacpo pair=size seed 2", "only in B") in reasons
    assert ("hacpo algo.delta_step=0.2 pair=size seed 0", "only in B") in reasons
    assert any(r == "timing cell of A: never evaluated" for _, r in reasons)
    assert len(pairing.unpaired) == 7  # 1 + 1 + 2 (delta_step) + 2 (gspo) + 1 (timing)


def test_an_ignored_key_is_left_out_of_the_identity() -> None:
    a = _manifest("a", [_cell("a0", "hacpo", 0, "algo.delta_step=0.1"),
                        _cell("a1", "hacpo", 0, "algo.delta_step=0.3", "train.steps=5")])
    b = _manifest("b", [_cell("b0", "hacpo", 0, "algo.delta_step=0.2")])
    assert not any(all(side) for side in pair_cells(a, b).groups.values())
    pairing = pair_cells(a, b, ignore=["algo.delta_step"])
    ((key, (in_a, in_b)),) = [(k, v) for k, v in pairing.groups.items() if all(v)]
    assert in_a[0].id == "a0" and in_b[0].id == "b0" and key.grid == ("method=hacpo", "pair=size")
    assert "algo.delta_step: (ignored, --ignore)" in pairing.differs
    # two cells of A that differ only in the ignored key would be one identity: said, not merged
    a = _manifest("a", [_cell("a0", "hacpo", 0, "algo.delta_step=0.1"),
                        _cell("a1", "hacpo", 0, "algo.delta_step=0.3")])
    pairing = pair_cells(a, b, ignore=["algo.delta_step"])
    assert [u.reason for u in pairing.unpaired] == [
        "A has another cell of this identity (a0); the keys left out tell them apart"]


@pytest.mark.parametrize(("text", "folder", "commit"), [
    ("cmpa", "ROOT/sweeps/cmpa", None),
    ("cmpa@1A2b3c4", "ROOT/sweeps/cmpa", "1a2b3c4"),
    ("elsewhere::cmpa@0123abcd", "CWD/elsewhere/sweeps/cmpa", "0123abcd"),
    ("./out/sweeps/x.y", "CWD/out/sweeps/x.y", None),
    ("/abs/sweeps/cmpa@abcd", "/abs/sweeps/cmpa", "abcd"),
])
def test_a_side_is_a_folder_a_root_and_name_or_a_name_and_maybe_a_commit(
        text: str, folder: str, commit: str | None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = parse_spec(text, tmp_path / "root", "A")
    expected = folder.replace("ROOT", str((tmp_path / "root").resolve())).replace(
        "CWD", str(tmp_path.resolve()))
    assert (str(spec.folder), spec.commit) == (expected, commit)


@pytest.mark.parametrize("text", ["cmpa@xyz1", "cmpa@abc", "@abcd", "::cmpa", "root::",
                                  "two words", "root::a/b"])
def test_a_side_in_no_known_form_names_the_forms(text: str, tmp_path: Path) -> None:
    with pytest.raises(CompareError) as err:
        parse_spec(text, tmp_path, "B")
    message = str(err.value)
    assert message.startswith(f"B={text!r}") and FORMS in message and "\n" not in message
    assert err.value.exit_code == 2


# -- the verdicts and the exit decision, on scores made here ------------------------------------------

def _scores(rng: np.random.Generator, seeds: int = 3, problems: int = 60) -> dict[str, np.ndarray]:
    return {b: (rng.random((seeds, problems)) < 0.5).astype(float) for b in BENCHMARKS}


def _result(pending: list[C.Paired]) -> C.CompareResult:
    return C.CompareResult("a", "b", ("A's", "B's"), [], C.judged(pending, n_boot=200), [], [],
                           "main")


def test_a_regression_fails_only_when_asked_significant_and_beyond_the_tolerance() -> None:
    rng = np.random.default_rng(0)
    a = _scores(rng, problems=200)
    worse = {b: m.copy() for b, m in a.items()}
    # 12 problems every seed solved in A, lost in B on every seed: -6 points on GSM8K
    lost = np.flatnonzero(a["tiny_gsm8k"].min(0) == 1)[:12]
    worse["tiny_gsm8k"][:, lost] = 0
    assert len(lost) == 12
    noisy = {b: np.where(rng.random(m.shape) < 0.05, 1 - m, m) for b, m in a.items()}
    result = _result([C.Paired("hacpo", "x", (0, 1, 2), a, worse),
                      C.Paired("gspo", "x", (0, 1, 2), a, noisy)])
    rows = {(r.group, r.benchmark): r for r in result.rows}
    assert len(rows) == 6 and result.tests == 6
    gsm8k = rows[("hacpo", "tiny_gsm8k")]
    drop = 100 * len(lost) / 200
    assert gsm8k.diff.estimate * 100 == pytest.approx(-drop)  # B - A, in points
    assert gsm8k.outcome == C.WORSE and gsm8k.verdict.p_adjusted is not None
    assert gsm8k.verdict.p_adjusted < 0.05
    assert (gsm8k.lost, gsm8k.gained, gsm8k.cases) == (3 * len(lost), 0, 600)
    assert rows[("hacpo", "AVG")].outcome == C.WORSE
    assert rows[("hacpo", "AVG")].lost == 3 * len(lost)
    assert rows[("hacpo", "tiny_aime2025")].outcome == C.NO_DIFFERENCE
    assert verdict_text(rows[("hacpo", "tiny_aime2025")]).startswith("no difference: the same")
    # 5% of answers flipped at random both ways: inside the noise, with the MDE said
    assert rows[("gspo", "AVG")].outcome == C.NO_DIFFERENCE
    assert "(MDE " in verdict_text(rows[("gspo", "AVG")])
    assert {r.label for r in result.regressions(0.5)} == {"hacpo, x, tiny_gsm8k", "hacpo, x, AVG"}
    assert C.exit_code(result, False, 0.5) == 0
    assert C.exit_code(result, True, 0.5) == C.REGRESSION_EXIT == 3
    # the AVG drops by half as much: a tolerance between the two leaves GSM8K alone
    assert [r.benchmark for r in result.regressions(drop * 0.75)] == ["tiny_gsm8k"]
    assert C.exit_code(result, True, drop * 0.75) == 3
    assert C.exit_code(result, True, drop + 0.01) == 0
    # B better is never a regression
    better = _result([C.Paired("hacpo", "x", (0, 1, 2), worse, a)])
    assert {r.outcome for r in better.rows} >= {C.BETTER}
    assert better.regressions(0.0) == [] and C.exit_code(better, True, 0.0) == 0


def test_one_family_holm_makes_a_borderline_difference_inconclusive() -> None:
    """A loss significant alone stops being so among many tests (Holm over all of them)."""
    rng = np.random.default_rng(3)
    a = _scores(rng, seeds=1, problems=200)
    b = {k: m.copy() for k, m in a.items()}
    solved = np.flatnonzero(a["tiny_gsm8k"][0] == 1)
    b["tiny_gsm8k"][0, solved[:6]] = 0  # -3 points on one seed: p about 0.006 alone
    alone = _result([C.Paired("g", "x", (0,), a, b)])
    row = next(r for r in alone.rows if r.benchmark == "tiny_gsm8k")
    assert row.outcome == C.WORSE and row.diff.p is not None and row.diff.p > 0.001
    crowd = _result([C.Paired("g", "x", (0,), a, b),
                     *(C.Paired(f"h{i}", "x", (0,), a, a) for i in range(15))])
    row = next(r for r in crowd.rows if r.group == "g" and r.benchmark == "tiny_gsm8k")
    assert row.diff.p == pytest.approx(next(
        r for r in alone.rows if r.benchmark == "tiny_gsm8k").diff.p)
    assert row.outcome == C.NO_DIFFERENCE and row.verdict.p_adjusted is not None
    assert row.verdict.p_adjusted > 0.05 and C.exit_code(crowd, True, 0.5) == 0


def test_the_protocol_compared_is_main_unless_no_cell_evaluates_it() -> None:
    def cells(*protocols: list[str]) -> SweepManifest:
        return _manifest("x", [dataclasses.replace(_cell(f"c{i}", "hacpo", i), protocols=p)
                               for i, p in enumerate(protocols)])

    assert C.default_protocol(cells(["ablation"], ["ablation"]), cells(["ablation"])) == "ablation"
    assert C.default_protocol(cells(["ablation"], ["main", "ablation"])) == "main"
    assert C.default_protocol(cells([], ["ablation"])) == "main"  # an older manifest: main
    assert C.default_protocol(cells(["a"], ["b"]), cells(["b"])) == "b"


# -- which run stands for a cell at a commit, on a real store -----------------------------------------

def test_at_a_commit_a_cell_whose_hash_changed_is_found_by_identity(new_output_root) -> None:
    """Runs made here through the Tracker: a cell's own hash wins; without it, the run the sweep
    made at that commit with the cell's method, seed, agent, team and grid settings; another
    sweep's run, another team's or other settings' never; two candidates are ambiguous."""
    from analysis.store import open_store
    from hacrl.schema import metric_names as M
    from hacrl.schema import tags as T
    from hacrl.tracking import Tracker

    root = new_output_root()
    uri = f"sqlite:///{root / 'mlflow.db'}"
    tracker = Tracker(uri, "hacrl-tiny")
    old = "0123abcd" * 5

    def job(config_hash: str, method: str, agents: tuple[str, ...], seed: int, *, sweeps: str = "s",
            commit: str = old, **params: str) -> dict[str, str]:
        tags = {T.CONFIG_HASH: config_hash, T.METHOD: method, T.SEED: str(seed),
                T.GIT_COMMIT: commit, T.SWEEPS: sweeps}
        parent = tracker.start_run("job", {**tags, T.KIND: T.JOB}, params)
        runs = {}
        for agent in agents:
            runs[agent] = tracker.start_run(agent, {**tags, T.KIND: T.AGENT, T.MODEL: agent},
                                            params, parent_run_id=parent)
            tracker.log_metrics(runs[agent], {M.eval_avg("main"): 0.5}, 0)
            tracker.finish(runs[agent])
        tracker.finish(parent)
        return runs

    mine = job("h0-before", "hacpo", AGENTS, 0, **{"algo.delta_step": "0.1"})
    job("h0-other", "hacpo", AGENTS, 0, **{"algo.delta_step": "0.2"})       # other settings
    job("h0-theirs", "hacpo", AGENTS, 0, sweeps="t", **{"algo.delta_step": "0.1"})  # other sweep
    job("h0-naive", "naive", AGENTS, 0, **{"algo.delta_step": "0.1"})        # other method
    job("h0-solo", "hacpo", AGENTS[1:], 0, **{"algo.delta_step": "0.1"})     # other team
    job("h0-seed1", "hacpo", AGENTS, 1, **{"algo.delta_step": "0.1"})        # other seed
    job("h0-now", "hacpo", AGENTS, 0, commit="9" * 40, **{"algo.delta_step": "0.1"})
    own = job("h1", "hacpo", AGENTS, 1, **{"algo.delta_step": "0.1"})        # its own hash
    twice = [job(f"h2-{i}", "hacpo", AGENTS, 2, **{"algo.delta_step": "0.1"}) for i in (0, 1)]
    cells = {seed: _cell(f"h{seed}", "hacpo", seed, "algo.delta_step=0.1") for seed in (0, 1, 2)}
    store = open_store(uri, "hacrl-tiny")
    side = Side(SweepSpec("s@0123abcd", root / "sweeps" / "s", "0123abcd"),
                _manifest("s", list(cells.values())), store, "s@0123abcd")
    picker = RunPicker(side, side.runs(), "main")
    picked = picker.pick(cells, AGENTS[1])
    assert picked.runs == {0: mine[AGENTS[1]], 1: own[AGENTS[1]]}
    assert picked.why[2] == ("2 cells of the sweep at commit 0123abcd match by identity (config "
                             "hashes h2-0, h2-1)")
    assert {twice[0][AGENTS[1]], twice[1][AGENTS[1]]}.isdisjoint(picked.runs.values())
    (note,) = picker.notes
    assert note == (f"s@0123abcd: hacpo pair=size algo.delta_step=0.1 seed 0 {'+'.join(AGENTS)}, "
                    f"{AGENTS[1]}: run {mine[AGENTS[1]]} at commit 0123abcd found by identity "
                    "(its config hash h0-before, the manifest's h0)")
    # a cell its sweep evaluated under another protocol only
    other = dataclasses.replace(cells[1], protocols=["ablation"])
    assert RunPicker(side, side.runs(), "main").pick({1: other}, AGENTS[1]).why == {
        1: "not evaluated under protocol main (its: ablation)"}
    # without a commit, a cell is its hash alone
    plain = RunPicker(dataclasses.replace(side, spec=SweepSpec("s", side.spec.folder)), store,
                      "main").pick(cells, AGENTS[1])
    assert plain.runs == {1: own[AGENTS[1]]} and plain.why[0] == "not run"


# -- the command line: bad input -----------------------------------------------------------------

def _compare(capsys: pytest.CaptureFixture[str], *words: str) -> tuple[int, str, str]:
    from hacrl.cli.main import main

    code = main(["compare", *words])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    root = tmp_path / "out"
    (root / "sweeps" / "bare").mkdir(parents=True)
    write_manifest(root / "sweeps" / "made", _manifest("made", [_cell("a0", "hacpo", 0)]))
    for words, says in [
        (["nowhere", "made"], f"A='nowhere': no sweep folder {root.resolve()}/sweeps/nowhere"),
        (["made", "bare"], f"B='bare': {root.resolve()}/sweeps/bare holds no manifest.json"),
        (["made", "made@zz99"], "B='made@zz99': @zz99 is not a commit prefix"),
        (["made", f"{root}::made"], "are the same runs"),
    ]:
        code, out, err = _compare(capsys, *words, f"output_root={root}")
        assert code == 2, (words, out, err)
        assert err.count("\n") == 1 and err.startswith("hacrl: compare: ") and says in err, err
    assert not (root / "reports").exists()


def test_a_sweep_without_a_finished_cell_is_one_line(new_output_root, capsys) -> None:
    root = new_output_root()
    for name in ("left", "right"):
        write_manifest(root / "sweeps" / name, _manifest(name, [
            _cell("c0ffee000000", "hacpo", 0), _cell("c0ffee000001", "hacpo", 1)]))
    code, _, err = _compare(capsys, "left", "right", f"output_root={root}")
    assert code == 2 and err.count("\n") == 1, err
    assert "A='left': none of its 2 cells has a finished run evaluated under protocol main" in err


# -- real sweeps ---------------------------------------------------------------------------------

@dataclass
class World:
    root: Path                         # the two sweeps' output root (read only: copy to change)
    sweep: Callable[..., None]         # sweep(name, output root, *overrides)
    base: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory, micro_zoo, data_root, mlflow_template, hacrl_cmd, tiny_job,
          sweep_file) -> World:
    base = tmp_path_factory.mktemp("compare")
    configs = base / "configs" / "sweep"
    gspo = "      - pair: size\n        method: gspo\n"  # seed 0, one cell per agent
    sweep_file(configs, "cmpa", "hacpo", grids="        seed: [0, 1, 2]\n" + gspo)
    sweep_file(configs, "cmpb", "hacpo", grids="        seed: [0, 1, 2, 3]\n" + gspo)
    root = base / "out"
    root.mkdir()
    shutil.copy(mlflow_template, root / "mlflow.db")
    alphas = {"cmpa": "algo.alpha=1", "cmpb": "algo.alpha=2"}

    def sweep(name: str, where: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env.update(HACRL_ZOO_DIR=str(micro_zoo), HACRL_OUTPUTS=str(where),
                   HACRL_DATA=str(data_root), PYTHONUNBUFFERED="1")
        out = subprocess.run([*hacrl_cmd, "sweep", name,
                              f"hydra.searchpath=[file://{configs.parent}]",
                              f"output_root={where}", alphas[name], *tiny_job],
                             env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr

    sweep("cmpa", root)
    sweep("cmpb", root)
    return World(root, sweep, base)


def _copy(world: World, name: str) -> Path:
    """A copy of the sweeps' output root to change (a moved root: its paths are re-based)."""
    dest = world.base / name
    shutil.copytree(world.root, dest)
    return dest


def _store(root: Path):
    from analysis.store import open_store

    return open_store(f"sqlite:///{root / 'mlflow.db'}", "hacrl-tiny")


def _agent_run(store, cell: CellRecord, agent: str) -> str:
    runs = store.runs
    found = runs[(runs["config_hash"] == cell.id) & (runs["model"] == agent)
                 & (runs["hacrl.kind"] == "agent") & (runs["status"] == "FINISHED")]
    assert len(found) == 1, (cell.id, agent)
    return str(found.iloc[0]["run_id"])


def _hacpo(root: Path, sweep: str) -> dict[int, CellRecord]:
    manifest = read_manifest(root / "sweeps" / sweep)
    assert manifest is not None
    return {c.seed: c for c in manifest.cells if c.method == "hacpo"}


def _outcomes_file(store, run_id: str) -> Path:
    from hacrl.schema import eval_artifacts

    path = store.artifact(run_id, eval_artifacts.outcomes("main"))
    assert path is not None and path.is_file()
    return path


def _csv(root: Path, a: str = "cmpa", b: str = "cmpb") -> pd.DataFrame:
    return pd.read_csv(root / "reports" / f"compare-{a}-vs-{b}" / "comparison.csv",
                       dtype={"seeds": str})


@pytest.mark.slow
def test_two_sweeps_differing_in_alpha_pair_by_seed_and_report(world: World, capsys) -> None:
    code, out, err = _compare(capsys, "cmpa", "cmpb", f"output_root={world.root}")
    assert code == 0, out + err
    assert "differs: algo.alpha: 1 -> 2 (command line)" in out
    assert "not compared: hacpo pair=size seed 3: only in B" in out
    for agent in AGENTS:  # the GSPO cells: trained once, by A, and found done by B
        assert f"unchanged: gspo pair=size, {agent} (seeds 0): the same runs in A and B" in out
    table = _csv(world.root)
    assert sorted(zip(table["agent"], table["benchmark"], strict=True)) == sorted(
        (a, b) for a in AGENTS for b in (*BENCHMARKS, "AVG"))
    assert set(table["cell"]) == {"hacpo pair=size"} and set(table["seeds"]) == {"0,1,2"}
    # each side's rows are the runs of its own cells, seed by seed, and read as they logged
    store = _store(world.root)
    cells_a, cells_b = _hacpo(world.root, "cmpa"), _hacpo(world.root, "cmpb")
    for row in table.itertuples():
        assert row.a_runs.split() == [_agent_run(store, cells_a[s], row.agent) for s in (0, 1, 2)]
        assert row.b_runs.split() == [_agent_run(store, cells_b[s], row.agent) for s in (0, 1, 2)]
        if row.benchmark != "AVG":
            for side, runs in (("a", row.a_runs), ("b", row.b_runs)):
                logged = store.runs.set_index("run_id").loc[runs.split(),
                                                             f"eval/main/{row.benchmark}/acc"]
                assert getattr(row, side) == pytest.approx(logged.mean(), abs=1e-9)
    assert (table["lo"] <= table["b_minus_a"]).all() and (table["b_minus_a"] <= table["hi"]).all()
    folder = world.root / "reports" / "compare-cmpa-vs-cmpb"
    page, md = (folder / "index.html").read_text(), (folder / "report.md").read_text()
    for text in (md, page):
        assert "hacpo pair=size seed 3: only in B" in text and "B - A" in text
        assert "algo.alpha: 1 -&gt; 2" in text or "algo.alpha: 1 -> 2" in text
    assert "<table>" in page and md.count("| hacpo pair=size |") == 6
    # the same command again replaces its own folder
    assert _compare(capsys, "cmpa", "cmpb", f"output_root={world.root}")[0] == 0


@pytest.mark.slow
def test_a_planted_regression_fails_the_gate_beyond_the_tolerance(world: World, capsys) -> None:
    """B's outcomes rewritten in a copy of the store: A's own, less the GSM8K problems A solved
    on every seed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = _copy(world, "regressed")
    store = _store(root)
    cells_a, cells_b = _hacpo(root, "cmpa"), _hacpo(root, "cmpb")
    lost = {}
    for agent in AGENTS:
        tables = {s: pd.read_parquet(_outcomes_file(store, _agent_run(store, cells_a[s], agent)))
                  for s in (0, 1, 2)}
        solved = set.intersection(*(set(t[(t["benchmark"] == "tiny_gsm8k")
                                              & (t["correct"] == 1)]["problem"])
                                    for t in tables.values()))
        assert len(solved) >= 5, (agent, solved)
        lost[agent] = len(solved)
        for seed, t in tables.items():
            t = t.assign(correct=np.where(t["problem"].isin(solved), 0, t["correct"]).astype("int8"))
            target = _outcomes_file(store, _agent_run(store, cells_b[seed], agent))
            pq.write_table(pa.Table.from_pandas(t, preserve_index=False), target)
    code, out, err = _compare(capsys, f"{root}::cmpa", f"{root}::cmpb", "--fail-on-regression",
                              f"output_root={root}")
    assert code == 3, out + err
    table = _csv(root).set_index(["agent", "benchmark"])
    drops = {}
    for agent in AGENTS:
        gsm8k = table.loc[(agent, "tiny_gsm8k")]
        assert gsm8k["verdict"] == "worse" and gsm8k["p_holm"] < 0.05
        assert (gsm8k["lost"], gsm8k["gained"]) == (3 * lost[agent], 0)
        assert gsm8k["b_minus_a"] == pytest.approx(-lost[agent] / 40)
        assert table.loc[(agent, "tiny_aime2025")]["verdict"] == C.NO_DIFFERENCE
        drops[agent] = -100 * gsm8k["b_minus_a"]
        for bench in ("tiny_gsm8k", "AVG"):
            assert f"hacrl: compare:   hacpo pair=size, {agent}, {bench}: B - A -" in err, err
    assert "significant regression(s) of B beyond --tolerance 0.5 pt (exit 3)" in err
    assert "aime" not in err
    # without the flag, or with a tolerance above the largest drop, it exits 0; just below it,
    # only that comparison fails
    assert _compare(capsys, f"{root}::cmpa", f"{root}::cmpb", f"output_root={root}")[0] == 0
    top, agent = max((d, a) for a, d in drops.items())
    assert _compare(capsys, f"{root}::cmpa", f"{root}::cmpb", "--fail-on-regression",
                    "--tolerance", f"{top + 0.01}", f"output_root={root}")[0] == 0
    code, _, err = _compare(capsys, f"{root}::cmpa", f"{root}::cmpb", "--fail-on-regression",
                            "--tolerance", f"{top - 0.01}", f"output_root={root}")
    assert code == 3 and err.count(": B - A -") == sum(d > top - 0.01 for d in drops.values())
    assert f"{agent}, tiny_gsm8k: B - A" in err
    # the same sweep in two output roots: a copied store holds the same run ids, each with the
    # outcomes of its own root (seed 3 was left as it was: the seeds disagree)
    code, out, err = _compare(capsys, f"{world.root}::cmpb", f"{root}::cmpb",
                              f"output_root={root}")
    assert code == 0, out + err
    assert "differs: nothing on the command lines" in out
    assert "not compared:" not in out and "unchanged:" not in out
    table = _csv(root, "out.cmpb", "regressed.cmpb").set_index(["cell", "agent", "benchmark"])
    for agent in AGENTS:
        gsm8k = table.loc[("hacpo pair=size", agent, "tiny_gsm8k")]
        assert (gsm8k["lost"], gsm8k["gained"], gsm8k["seeds"]) == (3 * lost[agent], 0, "0,1,2,3")
        assert gsm8k["b_minus_a"] == pytest.approx(-3 * lost[agent] / 160)
        assert table.loc[("gspo pair=size", agent, "AVG")]["b_minus_a"] == 0


@pytest.mark.slow
def test_what_cannot_be_compared_is_listed_with_its_reason(world: World, capsys) -> None:
    from mlflow.tracking import MlflowClient

    root = _copy(world, "holes")
    store = _store(root)
    cells_a, cells_b = _hacpo(root, "cmpa"), _hacpo(root, "cmpb")
    small, large = AGENTS
    failed = _agent_run(store, cells_a[1], large)
    MlflowClient(store.uri).set_terminated(failed, "FAILED")
    unlogged = _agent_run(store, cells_b[2], small)
    _outcomes_file(store, unlogged).unlink()
    cut = _outcomes_file(store, _agent_run(store, cells_b[0], large))
    t = pd.read_parquet(cut)
    t[t["problem"] != t["problem"].iloc[0]].to_parquet(cut, index=False)
    code, out, err = _compare(capsys, "cmpa", "cmpb", f"output_root={root}")
    assert code == 0, out + err
    assert f"not compared: hacpo pair=size seed 1, {large}: no finished run in A (failed)" in out
    assert (f"not compared: hacpo pair=size seed 2, {small}: no per-problem outcomes logged in "
            f"B (run {unlogged})") in out
    assert f"not compared: hacpo pair=size seeds 0,2, {large}: problems differ (tiny_gsm8k:" in out
    table = _csv(root)
    assert set(table["agent"]) == {small} and set(table["seeds"]) == {"0,1"}
    # a B that holds only its seed 3: nothing pairs, one line
    manifest = read_manifest(root / "sweeps" / "cmpb")
    assert manifest is not None
    write_manifest(root / "sweeps" / "only3", dataclasses.replace(
        manifest, sweep="only3", cells=[cells_b[3]]))
    code, _, err = _compare(capsys, "cmpa", "only3", f"output_root={root}")
    assert code == 2 and err.count("\n") == 1, err
    assert err == ("hacrl: compare: nothing of A='cmpa' pairs with B='only3': 5 x only in A; "
                   "1 x only in B\n")


@pytest.mark.slow
def test_one_sweep_at_two_commits(world: World, capsys) -> None:
    """`NAME@COMMIT` on both sides: the sweep's runs at an older commit (its runs retagged here;
    two of its cells with another config hash, as a change of the config would give them)
    against those two cells trained again at this checkout's commit."""
    from mlflow.tracking import MlflowClient

    from hacrl.core.layout import Layout

    root = _copy(world, "commits")
    store = _store(root)
    client = MlflowClient(store.uri)
    manifest = read_manifest(root / "sweeps" / "cmpa")
    assert manifest is not None
    ids = {c.id for c in manifest.cells}
    cells = _hacpo(root, "cmpa")
    for run_id, config_hash in store.runs[store.runs["config_hash"].isin(ids)][
            ["run_id", "config_hash"]].itertuples(index=False):
        client.set_tag(run_id, "git_commit", OLD_COMMIT)
        if config_hash in (cells[0].id, cells[1].id):
            client.set_tag(run_id, "config_hash", f"{config_hash}-before")
    for seed in (0, 1):
        shutil.rmtree(Layout.at(root).run(cells[seed].id, "hacpo").path)
    world.sweep("cmpa", root)
    store = _store(root)
    new = store.runs[(store.runs["config_hash"] == cells[0].id)
                     & (store.runs["git_commit"] != OLD_COMMIT)]["git_commit"]
    assert len(new) == 3  # the job and its two agents, trained again
    commit = str(new.iloc[0])
    if not COMMIT_PREFIX.fullmatch(commit):
        pytest.skip(f"the checkout has no git commit ({commit})")
    old, now = OLD_COMMIT[:8], commit[:10]
    code, out, err = _compare(capsys, f"cmpa@{old}", f"cmpa@{now}", f"output_root={root}")
    assert code == 0, out + err
    assert f"differs: commit: {old} -> {now}" in out
    for agent in AGENTS:
        assert (f"not compared: hacpo pair=size seed 2, {agent}: no finished run in B "
                "(not run)") in out
        assert f"not compared: gspo pair=size seed 0, {agent}: no finished run in B" in out
    table = _csv(root, f"cmpa@{old}", f"cmpa@{now}")
    assert set(table["seeds"]) == {"0,1"} and len(table) == 6
    tags = store.runs.set_index("run_id")[["git_commit", "config_hash", "model"]]
    for row in table.itertuples():
        a_runs, b_runs = row.a_runs.split(), row.b_runs.split()
        assert [tuple(tags.loc[r]) for r in a_runs] == [
            (OLD_COMMIT, f"{cells[s].id}-before", row.agent) for s in (0, 1)]
        assert [tuple(tags.loc[r]) for r in b_runs] == [
            (commit, cells[s].id, row.agent) for s in (0, 1)]
        for seed, run in zip((0, 1), a_runs, strict=True):
            assert (f"note: cmpa@{old}: hacpo pair=size seed {seed} {'+'.join(AGENTS)}, "
                    f"{row.agent}: run {run} at commit {old} found by identity (its config hash "
                    f"{cells[seed].id}-before, the manifest's {cells[seed].id})") in out
