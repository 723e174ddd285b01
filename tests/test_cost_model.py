"""The predicted cost of a sweep (hacrl.sweep.cost_model, cost_plan): a cell's work from its
config, the fit and its leave-one-out error, the sweep's wall time on its slots, the Table 7
calibration, and the estimate the dry run prints."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hacrl.config import compose
from hacrl.core.fileio import write_json
from hacrl.core.layout import SweepDir
from hacrl.schema.sweep_manifest import CellRecord, SweepManifest, write_manifest
from hacrl.sweep.cost_model import (
    TABLE7_MINUTES,
    UNITS,
    cell_work,
    fit,
    job_gpus,
    makespan,
    model_size_b,
)
from hacrl.sweep.cost_plan import calibration_for, measured_rows, plan, tiny_calibration

REFERENCE = Path(__file__).resolve().parents[1] / "analysis" / "reference" / "paper"


def _work(method: str, agents: list[str], *extra: str) -> dict[str, float]:
    cfg = compose([f"method={method}", f"agents=[{','.join(agents)}]", *extra])
    return cell_work(cfg, agents, [str(b) for b in cfg.eval.benchmarks])


def test_work_counts_what_each_method_samples_and_trains() -> None:
    one = ["qwen3-1.7b-base"]
    gspo, x2, updates_x2 = (_work(m, one) for m in ("gspo", "gspo_x2", "gspo_updates_x2"))
    pair = ["qwen3-1.7b-base", "qwen3-4b-base"]
    hacpo = _work("hacpo", pair)
    gspo_4b = _work("gspo", pair[1:])
    cfg = compose(["method=gspo"])
    steps, prompts = cfg.train.steps, cfg.train.prompts_per_step
    g, tokens = cfg.train.rollouts_per_prompt, cfg.rollout.max_new_tokens
    size = model_size_b(cfg, one[0])
    # the same agent's rollout tokens: x2 samples twice the rows; x2 updates does not
    assert gspo["train"] == pytest.approx(size * steps * prompts * g * tokens)
    assert x2["train"] == pytest.approx(2 * gspo["train"])
    assert updates_x2["train"] == pytest.approx(gspo["train"])
    # updates a step: 2 for GSPO (128 / 64 prompts at paper scale; 16 / 8 here), 4 for both x2
    assert gspo["updates"] == pytest.approx(size * steps * 2)
    assert x2["updates"] == updates_x2["updates"] == pytest.approx(2 * gspo["updates"])
    # HACPO: each agent trains on its own rows and its partner's (twice GSPO's rows, each in
    # its own size), and samples as GSPO does
    assert hacpo["train"] == pytest.approx(2 * (gspo["train"] + gspo_4b["train"]))
    assert hacpo["generate"] == pytest.approx(gspo["generate"] + gspo_4b["generate"])
    assert (hacpo["agents"], hacpo["cells"], gspo["agents"]) == (2, 1, 1)
    # a base model evaluates only
    base = _work("base", one)
    assert base["train"] == base["generate"] == base["updates"] == 0
    assert base["evaluate"] == pytest.approx(gspo["evaluate"]) and base["evaluate"] > 0


def test_evaluation_work_is_problems_times_samples_times_tokens() -> None:
    cfg = cfg10 = compose(["method=base", "eval.protocols.main.limit=10",
                           "eval.protocols.ablation.limit=10", "eval.benchmarks=[tiny_gsm8k]"])
    work = cell_work(cfg, ["qwen3-1.7b-base"], ["tiny_gsm8k"])
    size = model_size_b(cfg, "qwen3-1.7b-base")
    assert work["evaluate"] == pytest.approx(size * 10 * cfg.eval.protocols.main.max_new_tokens)
    twice = cell_work(compose(["method=base", "eval.protocols.main.limit=10",
                               "eval.benchmarks=[tiny_gsm8k]", "eval.protocols.main.samples=2"]),
                      ["qwen3-1.7b-base"], ["tiny_gsm8k"])
    assert twice["evaluate"] == pytest.approx(2 * work["evaluate"])
    # a cell two protocols evaluate costs both evaluations
    parts = [cell_work(cfg10, ["qwen3-1.7b-base"], ["tiny_gsm8k"], [p])["evaluate"]
             for p in ("main", "ablation")]
    both = cell_work(cfg10, ["qwen3-1.7b-base"], ["tiny_gsm8k"], ["main", "ablation"])
    assert both["evaluate"] == pytest.approx(sum(parts)) and min(parts) > 0
    # the sampled benchmark counts its k samples
    cfg = compose(["method=base", "eval.benchmarks=[tiny_aime2025]"])
    work = cell_work(cfg, ["qwen3-1.7b-base"], ["tiny_aime2025"])
    k = cfg.eval.protocols.main.sampled.aime2025.samples
    rows = cfg.data.sources.tiny_aime2025.rows
    assert k > 1
    assert work["evaluate"] == pytest.approx(size * rows * k * cfg.eval.protocols.main.max_new_tokens)


def test_sizes_and_gpus() -> None:
    tiny = compose([])
    assert model_size_b(tiny, "qwen3-1.7b-base") < model_size_b(tiny, "qwen3-4b-base") \
        < model_size_b(tiny, "qwen3-8b-base")
    # hidden 48, 3 layers, 4 query and 2 key-value heads of 12, MLP 96: per layer q, o (2 x 48
    # x 48), k, v (2 x 48 x 24) and three 48 x 96 matrices
    assert model_size_b(tiny, "qwen3-1.7b-base") == pytest.approx(3 * (6912 + 13824) / 1e9)
    paper = compose(["scale=paper"])
    assert model_size_b(paper, "qwen3-4b-base") == 4.0
    assert model_size_b(paper, "llama3.2-3b-instruct") == 3.21
    assert job_gpus(compose(["engine.device=cpu"])) == 0
    assert job_gpus(compose(["engine=verl", "engine.device=cuda", "engine.nnodes=2",
                             "engine.gpus_per_node=4"])) == 8
    assert job_gpus(compose(["engine=verl", "engine.device=cpu"])) == 0
    assert job_gpus(compose(["engine.device=cuda"])) == 1


def test_the_fit_recovers_seconds_per_unit_and_leaving_one_out_says_how_well() -> None:
    rng = np.random.default_rng(0)
    truth = {"generate": 0.5, "evaluate": 0.0, "train": 2.0, "updates": 0.0, "agents": 3.0,
             "cells": 1.0}
    rows = []
    for _ in range(20):
        work = {u: float(rng.uniform(1, 10)) for u in UNITS}
        rows.append((work, sum(truth[u] * work[u] for u in UNITS)))
    calibration = fit(rows, "synthetic", names=[str(i) for i in range(20)])
    assert calibration.seconds_per_unit == pytest.approx(truth, abs=1e-6)
    assert max(abs(e) for e in calibration.loo_errors) < 1e-6
    assert calibration.loo_total_error == pytest.approx(0, abs=1e-6)
    assert [c[0] for c in calibration.checks] == [str(i) for i in range(20)]
    # noise shows in the leave-one-out errors, and a row the others do not explain stands out
    noisy = [(w, s * (3.0 if i == 0 else float(rng.uniform(0.9, 1.1))))
             for i, (w, s) in enumerate(rows)]
    calibration = fit(noisy, "noisy")
    errors = np.abs(calibration.loo_errors)
    assert errors[0] == errors.max() and errors[0] > 0.4
    assert np.median(errors[1:]) < 0.25
    assert all(v >= 0 for v in calibration.seconds_per_unit.values())


def test_the_fit_weighs_rows_by_their_relative_error() -> None:
    """A 1 s cell counts as much as a 100 s one: one constant for both is ~1 s (relative
    least squares), not the 50 s plain least squares would give."""
    calibration = fit([({"cells": 1.0}, 1.0), ({"cells": 1.0}, 100.0)], "x", units=("cells",))
    assert calibration.seconds_per_unit["cells"] == pytest.approx(1.01 / 1.0001)


def test_makespan_is_longest_first_on_the_slots() -> None:
    assert makespan([3, 3, 2, 2, 2], 2) == 7
    assert makespan([1, 1, 2, 2, 3], 2) == 5  # in the given order: 6
    assert makespan([5, 1, 1, 1], 2) == 5
    assert makespan([1, 1, 1, 1], 1) == 4
    assert makespan([], 3) == 0
    assert makespan([4, 4, 4], 8) == 4


def test_table7_minutes_are_the_papers() -> None:
    with (REFERENCE / "runtime.csv").open() as f:
        published = {(r["method"], r["model"]): float(r["wall_minutes"]) for r in csv.DictReader(f)
                     if r["method"] != "hacpo" or r["model"] == "total"}
    published = {k: v for k, v in published.items() if k[1] != "total" or k[0] == "hacpo"}
    assert published == TABLE7_MINUTES


def test_the_paper_calibration_fits_table7_and_states_its_error() -> None:
    calibration = calibration_for("paper", Path("/nonexistent"),
                                  lambda o: compose(["scale=paper", *o]))
    assert len(calibration.checks) == len(TABLE7_MINUTES) == 7
    for name, measured, fitted, left_out in calibration.checks:
        assert abs(fitted / measured - 1) < 0.25, name
        assert abs(left_out / measured - 1) < 0.5, name
    # evaluation (absent from Table 7) is priced as rollout generation
    assert calibration.seconds_per_unit["evaluate"] == calibration.seconds_per_unit["generate"]
    hacpo = next(c for c in calibration.checks if c[0] == "hacpo total")
    assert hacpo[1] == 331 * 60


def _manifest(folder: Path, cells: list[CellRecord], walls: dict[str, float]) -> None:
    """A finished sweep's folder: odd cells as a SLURM array or an earlier run leaves them
    (skipped, the seconds their job recorded only), even ones measured by the sweep."""
    write_manifest(folder, SweepManifest(sweep=folder.name, cells=cells, arguments=[],
                                         asked=len(cells), tracking_uri="sqlite:///x.db"))
    rows = [{"cell": k, "status": "done", "wall_s": v, "seconds": v - 1.0} if i % 2 == 0 else
            {"cell": k, "status": "skipped", "seconds": v} for i, (k, v) in enumerate(walls.items())]
    rows.append({"cell": "f" * 12, "status": "failed", "seconds": 1e6})  # not a measurement
    write_json(SweepDir(folder).status, {"sweep": folder.name, "seconds": sum(walls.values()),
                                         "rows": rows})


def test_a_root_that_measured_enough_cells_calibrates_on_them(tmp_path: Path) -> None:
    cells = [CellRecord(f"{i:012x}", [], "gspo", ["a"], 0, scale="tiny",
                        work={"train": float(i + 1), "cells": 1.0}) for i in range(10)]
    walls = {c.id: 2.0 * c.work["train"] + 5.0 for c in cells}
    _manifest(tmp_path / "sweeps" / "one", cells, walls)
    rows = measured_rows(tmp_path, "tiny")
    assert sorted(s for _, s in rows) == sorted(walls.values())
    assert measured_rows(tmp_path, "paper") == []
    calibration = calibration_for("tiny", tmp_path, compose)
    assert "10 cells measured" in calibration.source
    assert calibration.seconds_per_unit["train"] == pytest.approx(2.0)
    assert calibration.seconds_per_unit["cells"] == pytest.approx(5.0)
    # too few measured cells: the shipped calibration
    _manifest(tmp_path / "sweeps" / "one", cells[:3], {c.id: walls[c.id] for c in cells[:3]})
    assert calibration_for("tiny", tmp_path, compose).source == tiny_calibration().source
    # the plan: done cells cost nothing more; two slots
    todo = [CellRecord(f"b{i:011x}", [], "gspo", ["a"], 0, work={"train": 1.0, "cells": 1.0},
                       gpus=2) for i in range(3)]
    p = plan(todo, {todo[0].id}, calibration, 2, 5)
    assert [c.done for c in p.cells] == [True, False, False]
    assert p.wall_s() == pytest.approx(7.0)  # two cells of 7 s side by side
    assert p.gpu_hours() == pytest.approx(2 * 7.0 * 2 / 3600)
    assert plan(todo, set(), calibration, 1, 3).wall_s() == pytest.approx(21.0)
    assert plan(todo, set(), calibration, None, 3).wall_s() == pytest.approx(7.0)


@pytest.mark.slow
def test_the_dry_run_prints_the_estimate(tmp_path, cli_env, hacrl_cmd, sweep_file) -> None:
    configs = tmp_path / "configs" / "sweep"
    sweep_file(configs, "est", "[gspo, hacpo]", grids="        seed: [0, 1]\n")
    out = subprocess.run([*hacrl_cmd, "plan", "est", f"hydra.searchpath=[file://{configs.parent}]",
                          f"output_root={tmp_path}"], env=cli_env(tmp_path),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "estimate: seconds per unit from" in text and tiny_calibration().source in text
    assert "total: 6 distinct cells (6 asked), 0 done, 6 to run; wall ≈" in text
    assert "leave-one-out" in text and "no GPUs" in text
    assert "gspo " in text and "hacpo " in text
    # nothing ran
    assert not (tmp_path / "runs").exists()


def test_validation_counts_its_problems_or_the_whole_benchmark() -> None:
    """In-loop validation: `validation.problems` of the benchmark, or all of its rows (null)."""
    def generate(*extra: str) -> float:
        cfg = compose(["method=gspo", "validation.every=5", *extra])
        return cell_work(cfg, ["qwen3-1.7b-base"], [])["generate"]

    cfg = compose(["method=gspo", "validation.every=5"])
    size = model_size_b(cfg, "qwen3-1.7b-base")
    validations = cfg.train.steps // 5 + 1
    per_problem = size * validations * cfg.validation.max_new_tokens
    some, none_ = generate("validation.problems=10"), generate("validation.problems=null")
    rows = cfg.data.sources[str(cfg.validation.benchmark)].rows
    assert none_ - some == pytest.approx(per_problem * (rows - 10))
    assert generate("validation.every=0") < some


def test_a_prediction_counts_only_the_units_both_sides_name() -> None:
    from hacrl.sweep.cost_model import Calibration

    calibration = Calibration({"train": 2.0}, "x", 3, [0.1, -0.3, 0.2], 0.05)
    assert calibration.predict({"train": 3.0, "cells": 1.0}) == 6.0  # no seconds for cells
    assert Calibration({"train": 2.0, "cells": 5.0}, "x").predict({"train": 3.0}) == 6.0
    assert calibration.typical_error() == pytest.approx(0.2)
    assert calibration.error_summary() == \
        "leave-one-out error over 3 rows: median 20%, largest 30%"
    assert Calibration({}, "x").typical_error() is None
    assert "no leave-one-out" in Calibration({}, "x").error_summary()
