"""Draws of the tiny zoo (`hacrl zoo build --seed`) are other models: their jobs are other
cells, a job or sweep refuses a zoo whose cards disagree with `scale.zoo_seed`, and a base
model's evaluations are found again only for its own draw (a zoo rebuilt in place with another
seed keeps its paths)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hacrl.config import ConfigError, compose, config_hash, validate

BASE = ["train.steps=2", "train.prompts_per_step=4", "train.minibatch_prompts=2"]


def _drawn_zoo(micro_zoo: Path, root: Path, seed: int) -> Path:
    """The micro zoo with zoo-build cards saying it was built with `seed`."""
    shutil.copytree(micro_zoo, root)
    for card_path in root.glob("*/zoo_card.json"):
        card = json.loads(card_path.read_text())
        card.update(seed=seed, init_seed=1234)  # `init_seed`: what a zoo build's card records
        card_path.write_text(json.dumps(card))
    return root


def test_config_hash_tells_zoo_draws_apart():
    for cell in (BASE, [*BASE, "method=base"]):
        default = config_hash(compose(cell))
        assert config_hash(compose([*cell, "scale.zoo_seed=0"])) == default  # ids kept
        assert config_hash(compose([*cell, "scale.zoo_seed=1"])) != default
    # no zoo at paper scale: the key is null there
    assert compose(["scale=paper"]).scale.zoo_seed is None


def test_a_zoo_of_another_draw_is_refused_until_its_seed_is_given(micro_zoo, monkeypatch,
                                                                   tmp_path):
    monkeypatch.setenv("HACRL_ZOO_DIR", str(_drawn_zoo(micro_zoo, tmp_path / "zoo", 1)))
    with pytest.raises(ConfigError) as err:
        validate(compose())
    message = str(err.value)
    assert "zoo seed 1" in message and "scale.zoo_seed=0" in message
    assert "pass scale.zoo_seed=1" in message and "\n" not in message
    assert validate(compose(["scale.zoo_seed=1"])).cfg.scale.zoo_seed == 1
    with pytest.raises(ConfigError, match=r"scale.zoo_seed=null: pass scale.zoo_seed=1"):
        validate(compose(["scale.zoo_seed=null"]))  # null is the default draw's identity
    with pytest.raises(ConfigError, match=r"scale.zoo_seed=-1: must be an integer in \[0, 4294967295\], or null"):
        validate(compose(["scale.zoo_seed=-1"]))
    (tmp_path / "zoo" / "qwen3-1.7b-base" / "zoo_card.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"qwen3-1.7b-base/zoo_card.json: unreadable zoo card"):
        validate(compose(["scale.zoo_seed=1"]))


def test_a_sweep_on_another_zoo_draw_has_its_own_cells(micro_zoo, monkeypatch, tmp_path):
    from hacrl.sweep.grid import expand

    monkeypatch.setenv("HACRL_ZOO_DIR", str(micro_zoo))  # micro models: no zoo draw to check
    default = {c.id for c in expand("table2", lambda o: compose(o)).cells}
    monkeypatch.setenv("HACRL_ZOO_DIR", str(_drawn_zoo(micro_zoo, tmp_path / "zoo", 2)))
    with pytest.raises(ConfigError, match=r"built with zoo seed 2 .* pass scale.zoo_seed=2"):
        expand("table2", lambda o: compose(o))  # before any cell runs or counts as done
    cells = expand("table2", lambda o: compose([*o, "scale.zoo_seed=2"])).cells
    assert {c.zoo_seed for c in cells} == {2}
    assert not default & {c.id for c in cells}


def test_a_base_models_evaluation_belongs_to_its_zoo_draw(new_output_root, tmp_path):
    """The same model path under two draws (a zoo rebuilt in place with --force --seed 1):
    the job, the sweep's "done" check and the report each take the evaluation of their draw."""
    from analysis.cell_values import cell_runs
    from analysis.store import open_store
    from hacrl.evaluation.runner import standalone_run
    from hacrl.schema import tags as T
    from hacrl.schema.sweep_manifest import CellRecord
    from hacrl.sweep.grid import Cell
    from hacrl.sweep.state import artifacts_status
    from hacrl.tracking import Tracker

    uri = f"sqlite:///{new_output_root() / 'mlflow.db'}"
    tracker = Tracker(uri, "hacrl-tiny")
    path = str(tmp_path / "zoo" / "qwen3-4b-base")
    old = tracker.start_run("an evaluation from before draws were told apart",
                            {T.KIND: T.EVAL, T.MODEL_PATH: path, T.SCALE: "tiny"})
    tracker.finish(old)
    cfg = compose(["scale.zoo_seed=1"])
    first = standalone_run(tracker, cfg, "qwen3-4b-base", path, "base")
    tracker.finish(first)
    assert first != old
    assert standalone_run(tracker, cfg, "qwen3-4b-base", path, "base") == first  # found again
    assert standalone_run(tracker, compose(), "qwen3-4b-base", path, "base") == old

    paper = standalone_run(tracker, compose(["scale=paper"]), "m", "org/m", "base")
    assert T.ZOO_SEED not in tracker.client.get_run(paper).data.tags  # no zoo at paper scale

    # the sweep's "done" check: each run holds its draw's evaluation (protocol key, benchmarks)
    for run in (old, first):
        tracker.set_tags(run, {T.eval_tag("main", "key"): "k",
                               T.eval_tag("main", "benchmarks"): '["tiny_gsm8k"]'})
    store = open_store(uri, "hacrl-tiny")
    for draw, run in ((0, old), (1, first), (2, None)):
        cell = CellRecord(id="x", overrides=[], method="base", agents=["qwen3-4b-base"], seed=0,
                          protocols=["main"], trains=False, model_paths={"qwen3-4b-base": path},
                          protocol_keys={"main": "k"}, benchmarks=["tiny_gsm8k"], scale="tiny",
                          zoo_seed=draw)
        assert list(cell_runs(store, cell, "qwen3-4b-base")["run_id"]) == ([run] if run else [])
        assert artifacts_status(Cell.of(cell), tracker) == (("done", run) if run else ("absent", ""))


def test_a_report_names_the_zoo_draw_it_shows():
    from analysis.context import Context
    from hacrl.schema.sweep_manifest import CellRecord

    def note(*draws: int) -> str:
        cells = [CellRecord(id=str(d), overrides=[], method="gspo", agents=["a"], seed=0,
                            zoo_seed=d) for d in draws]
        return Context(store=None, cells=cells, scale="tiny").scale_note  # type: ignore[arg-type]

    assert "zoo draw" not in note(0, 0)  # the default draw reads as before
    assert "tiny models, zoo draw 1:" in note(1, 1)


def test_a_report_is_made_from_the_manifest_of_its_own_draw(micro_zoo, monkeypatch, tmp_path):
    """`hacrl report table2 scale.zoo_seed=1` after a draw-0 sweep in the same output root
    expands the draw-1 cells instead of reporting the manifest's draw-0 cells."""
    from hacrl.cli.sweep_report import report_record
    from hacrl.core.layout import Layout
    from hacrl.schema.sweep_manifest import SweepManifest, write_manifest
    from hacrl.sweep.grid import expand

    monkeypatch.setenv("HACRL_ZOO_DIR", str(micro_zoo))
    root = tmp_path / "out"
    here = [f"output_root={root}"]
    swept = expand("table2", lambda o: compose([*here, *o])).cells
    write_manifest(Layout.at(root).sweep("table2").path,
                   SweepManifest(sweep="table2", cells=list(swept)))
    assert [c.id for c in report_record("table2", here, compose(here)).cells] == \
        [c.id for c in swept]  # the manifest's cells, as before

    monkeypatch.setenv("HACRL_ZOO_DIR", str(_drawn_zoo(micro_zoo, tmp_path / "zoo", 1)))
    other = [*here, "scale.zoo_seed=1"]
    cells = report_record("table2", other, compose(other)).cells
    assert {c.zoo_seed for c in cells} == {1} and not {c.id for c in cells} & {c.id for c in swept}
