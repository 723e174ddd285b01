"""`hacrl bench floor`: the real step's engine calls are recorded and replayed as bare model
calls with the same shapes; the report prints each phase next to its floor."""

from __future__ import annotations

from pathlib import Path

import pytest


def _small(tiny_job: list[str]) -> list[str]:
    return [o for o in tiny_job if not o.startswith(("validation", "eval"))]


def test_the_floor_replays_what_the_step_asked_of_each_engine(job_env: Path, tmp_path: Path,
                                                              tiny_job: list[str]) -> None:
    from hacrl.compute_floor import PHASES, measure
    from hacrl.config import compose, validate

    spec = validate(compose(["method=hacpo", "validation.every=0", "eval.at_end=false",
                             f"output_root={tmp_path}", *_small(tiny_job)]))
    reals, floors = measure(spec, repeats=1)
    assert len(reals) == len(floors) == 1
    for phase in PHASES:
        assert reals[0][phase] > 0 and floors[0][phase] > 0, phase


def test_recording_sees_the_shapes_of_a_step(job_env: Path, tmp_path: Path,
                                             tiny_job: list[str]) -> None:
    from hacrl.compute_floor import _loop
    from hacrl.config import compose, validate

    spec = validate(compose(["method=hacpo", f"output_root={tmp_path}", *_small(tiny_job)]))
    loop, engines = _loop(spec)
    loop.step(1)
    prompts, group = int(spec.cfg.train.prompts_per_step), int(spec.cfg.train.rollouts_per_prompt)
    for engine in engines:
        (rows, prompt, new), = engine.calls.generate
        assert rows == prompts * group and prompt > 0 and 0 < new <= 16
        # own and borrowed rows are trained: each update sees both agents' samples
        assert sum(r for r, _, _ in engine.calls.update) == 2 * prompts * group
        assert all(width > response for _, width, response in engine.calls.logprob)
        engine.close()


def test_other_engines_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from hacrl.compute_floor import floor_report

    assert floor_report(["engine=verl", "engine.device=cpu"]) == 2
    assert "use engine=local" in capsys.readouterr().err
