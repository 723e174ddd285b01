"""`hacrl bench floor` and the floor columns of `hacrl bench step`: the real step's engine calls
are recorded and replayed as bare model calls with the same shapes; each phase is printed next
to its floor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def _small(tiny_job: list[str]) -> list[str]:
    return [o for o in tiny_job if not o.startswith(("validation", "eval"))]


def test_the_floor_replays_what_the_step_asked_of_each_engine(job_env: Path, tmp_path: Path,
                                                              tiny_job: list[str]) -> None:
    from hacrl.bench.compute_floor import PHASES, measure
    from hacrl.config import compose, validate

    spec = validate(compose(["method=hacpo", "validation.every=0", "eval.at_end=false",
                             f"output_root={tmp_path}", *_small(tiny_job)]))
    reals, floors = measure(spec, repeats=1)
    assert len(reals) == len(floors) == 1
    for phase in PHASES:
        assert reals[0][phase] > 0 and floors[0][phase] > 0, phase


def test_recording_sees_the_shapes_of_a_step(job_env: Path, tmp_path: Path,
                                             tiny_job: list[str]) -> None:
    from hacrl.bench.compute_floor import team_loops
    from hacrl.config import compose, validate

    spec = validate(compose(["method=hacpo", f"output_root={tmp_path}", *_small(tiny_job)]))
    (loop,), engines = team_loops(spec, record=True)
    loop.step(1)
    prompts, group = int(spec.cfg.train.prompts_per_step), int(spec.cfg.train.rollouts_per_prompt)
    for engine in engines:
        (rows, prompt, new), = engine.calls.generate
        assert rows == prompts * group and prompt > 0 and 0 < new <= 16
        # own and borrowed rows are trained: each update sees both agents' samples
        assert sum(c.rows for c in engine.calls.update) == 2 * prompts * group
        assert all(c.width > c.response and c.width > c.prompt for c in engine.calls.logprob)
        # a step's rows share their prompts: G samples (and the partner's) of each
        assert all(c.prompts <= min(prompts, c.rows) for c in engine.calls.update)
        engine.close()


def test_other_engines_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from hacrl.bench.compute_floor import floor_report

    assert floor_report(["engine=verl", "engine.device=cpu"]) == 2
    assert "use engine=local" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_step_prints_each_methods_phases_against_their_floor(
        job_env: Path, tmp_path: Path, tiny_job: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    from hacrl.cli import main

    assert main(["bench", "step", "--repeats", "1", f"output_root={tmp_path}",
                 *_small(tiny_job)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("compute floor:"):].splitlines()
    assert table[1].split() == ["phase", "gspo_x2", "floor", "ratio", "hacpo", "floor", "ratio"]
    rows = {line.split()[0]: line.split()[1:] for line in table[2:]}
    for phase in ("generate", "logprob", "update", "total"):  # real, floor, ratio per method
        assert len(rows[phase]) == 6 and all(float(x) > 0 for x in rows[phase]), rows[phase]
    assert rows["verify"][1:3] == rows["verify"][4:6] == ["-", "-"]  # no tensor floor
    # the whole step: every phase and verification, against the tensor phases' floors
    for real, floor in ((0, 1), (3, 4)):
        assert float(rows["total"][real]) >= sum(float(rows[p][real]) for p in
                                                 ("generate", "logprob", "update")) - 0.003
        assert abs(float(rows["total"][floor]) - sum(float(rows[p][floor]) for p in
                                                     ("generate", "logprob", "update"))) < 0.003


def test_bench_step_on_another_engine_says_in_one_line_why_no_floor(
        capsys: pytest.CaptureFixture[str]) -> None:
    from hacrl.bench.step import _print_floors

    _print_floors({}, {}, "verl", repeats=3)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "not measured on engine=verl" in lines[0]


def test_generate_floor_runs_the_decoder_the_engine_samples_with(
        micro_zoo: Path, one_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The zoo's models sample through the lean decoder on a CPU, so their generate floor is its
    forwards (one prefill, then a step per token); other models' is transformers' forward."""
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    from hacrl.bench import compute_floor
    calls: list[dict[str, Any]] = []
    real = compute_floor.lean_generate

    def noted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(compute_floor, "lean_generate", noted)
    model = AutoModelForCausalLM.from_pretrained(micro_zoo / "qwen3-4b-base").eval()
    assert compute_floor.generate_floor(model, rows=4, prompt=5, new_tokens=3) > 0
    assert len(calls) == 1 and calls[0]["max_new_tokens"] == 3 and calls[0]["eos"] == []
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2)).eval()
    assert compute_floor.generate_floor(gpt2, rows=4, prompt=5, new_tokens=3) > 0
    assert len(calls) == 1
