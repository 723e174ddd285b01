"""`hacrl bench floor`: each phase of one real training step next to its compute floor.

The floor of a phase is the tensor work it cannot avoid, timed on this machine with the same
shapes the real step used: while the real step runs, every engine call is recorded (rows,
prompt width, tokens generated; rows and width of each log-prob and update forward), then
the same shapes are replayed as bare model calls:

    generate  one batched prefill forward, then one forward per generated token with the KV
              cache (the next token by argmax: sampling itself is not the floor's business);
              the lean decoder's forwards where the engine samples with it
    logprob   no-grad forwards over the recorded rows, log-softmax and gather of the targets;
              each distinct prompt once where the engine shares prompts (the zoo's models on a
              CPU, `hacrl.engines.prompt_sharing`), with the step's count of distinct prompts
    update    forwards, log-softmax and gather, backwards, gradient clipping and an AdamW step,
              on a copy of the model (the real engine's weights are left alone)

Log-prob and update rows go through the model as many at a time as the engine's own forwards
take (`engine.forward_rows`), so the floor measures the same batches the engine runs.

Real and floor are measured in turn, step after step (step 1 warms up and is dropped), so the
machine's noise hits both alike; the ratio of medians says how far a phase is from its floor.
Verification has no tensor floor and is shown on its own; the total is the whole step,
verification included, against the floors of the tensor phases. Local engine only. `hacrl bench
step` prints the same table for gspo_x2 and hacpo (team_loops, FloorMeter, print_floor_table).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import torch

from hacrl.algo.rollout import TokenView
from hacrl.config import ConfigError, JobSpec, compose, validate
from hacrl.core.errors import print_error
from hacrl.data.tasks import grader, load_problems
from hacrl.engines.base import Engine
from hacrl.engines.prompt_sharing import prompt_sharing_applies, prompt_sharing_logprobs
from hacrl.job import agent_engine, job_dir
from hacrl.schema import metric_names as M
from hacrl.training.loop import Agent, PromptSchedule, TeamLoop, seed_everything
from hacrl.zoo.lean_decoder import lean_decoder, lean_generate

PHASES = ("generate", "logprob", "update")  # the phases with a tensor floor
STEP_PHASES = ("generate", "verify", "logprob", "update")  # what a step's metrics time


@dataclass(frozen=True)
class Rows:
    """The shape of the rows of one log-prob or update call."""

    rows: int
    width: int  # the longest prompt + response
    response: int  # the longest response (the positions scored)
    prompts: int  # distinct prompts among the rows
    prompt: int  # the longest prompt


@dataclass
class Calls:
    """The shapes one engine was asked for during one step."""

    generate: list[tuple[int, int, int]] = field(default_factory=list)  # rows, prompt, new tokens
    logprob: list[Rows] = field(default_factory=list)
    update: list[Rows] = field(default_factory=list)


class Recording:
    """An engine that records the shapes of what it is asked, then does it."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.calls = engine, Calls()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: Any) -> Any:
        out = self.engine.generate(prompt_ids, n, sampling)
        new = max((len(g.token_ids) for gens in out for g in gens), default=0)
        self.calls.generate.append((len(prompt_ids) * n, max(map(len, prompt_ids)), new))
        return out

    def log_probs(self, views: list[Any], reference: bool = False) -> Any:
        self.calls.logprob.append(_shape(views))
        return self.engine.log_probs(views, reference=reference)

    def train_minibatch(self, views: list[Any], batch: Any, loss_fn: Any) -> Any:
        self.calls.update.append(_shape(views))
        return self.engine.train_minibatch(views, batch, loss_fn)


def _shape(views: list[Any]) -> Rows:
    return Rows(rows=len(views),
                width=max(len(v.prompt_ids) + len(v.response_ids) for v in views),
                response=max(1, max(len(v.response_ids) for v in views)),
                prompts=len({tuple(v.prompt_ids) for v in views}),
                prompt=max(len(v.prompt_ids) for v in views))


def _timed(work: Callable[[], object]) -> float:
    tic = time.perf_counter()
    work()
    return time.perf_counter() - tic


@torch.no_grad()
def generate_floor(model: Any, rows: int, prompt: int, new_tokens: int) -> float:
    """Seconds of a prefill over [rows, prompt] and new_tokens - 1 cached one-token forwards."""
    ids = torch.randint(int(model.config.vocab_size), (rows, prompt))
    decoder = lean_decoder(model)
    if decoder is not None:  # the forwards the engine's sampler runs (no EOS: every step)
        return _timed(lambda: lean_generate(decoder, ids, torch.ones_like(ids), eos=[],
                                            max_new_tokens=new_tokens, pad_id=0, greedy=True))

    def work() -> None:
        out = model(input_ids=ids, use_cache=True)
        for _ in range(max(0, new_tokens - 1)):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)

    return _timed(work)


def _token_logp(model: Any, ids: torch.Tensor, response: int) -> torch.Tensor:
    """Log-probs of the last `response` tokens of each row (one forward; the softmax only where
    a token is scored, as the engines do)."""
    logits = model(input_ids=ids).logits[:, -response - 1:-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, -response:, None]).squeeze(-1)


def _row_batches(model: Any, shape: Rows,
                 per_forward: int | None) -> list[Callable[[], torch.Tensor]]:
    """The forwards of one call, each returning its log-probs: random tokens of the recorded
    shape, `per_forward` rows at a time; with prompt sharing, `shape.prompts` distinct prompts
    with their rows together (as the engine orders them), else whole rows."""
    vocab = int(model.config.vocab_size)
    per_forward = per_forward or shape.rows
    if not prompt_sharing_applies(model):
        ids = torch.randint(vocab, (shape.rows, shape.width))
        return [partial(_token_logp, model, chunk, shape.response)
                for chunk in ids.split(per_forward)]
    prompts = [tuple(torch.randint(vocab, (shape.prompt,)).tolist()) for _ in range(shape.prompts)]
    views = [TokenView(prompts[r * shape.prompts // shape.rows],
                       tuple(torch.randint(vocab, (shape.response,)).tolist()))
             for r in range(shape.rows)]
    return [partial(_shared_logp, model, views[first:first + per_forward], shape.response)
            for first in range(0, shape.rows, per_forward)]


def _shared_logp(model: Any, views: list[TokenView], response: int) -> torch.Tensor:
    return cast(torch.Tensor, prompt_sharing_logprobs(model, views, response, 1.0, 0))


@torch.no_grad()
def logprob_floor(model: Any, shape: Rows, per_forward: int | None = None) -> float:
    forwards = _row_batches(model, shape, per_forward)
    return _timed(lambda: [forward() for forward in forwards])


def update_floor(model: Any, optimizer: torch.optim.Optimizer, shape: Rows,
                 per_forward: int | None = None) -> float:
    forwards = _row_batches(model, shape, per_forward)

    def work() -> None:
        for forward in forwards:
            forward().mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _timed(work)


def floor_seconds(model: Any, scratch: Any, optimizer: torch.optim.Optimizer,
                  calls: Calls, per_forward: int | None = None) -> dict[str, float]:
    """The floor of each phase for one engine's recorded calls of one step."""
    model.eval()
    return {"generate": sum(generate_floor(model, *c) for c in calls.generate),
            "logprob": sum(logprob_floor(model, c, per_forward) for c in calls.logprob),
            "update": sum(update_floor(scratch, optimizer, c, per_forward)
                          for c in calls.update)}


def team_loops(spec: JobSpec, record: bool = False) -> tuple[list[TeamLoop], list[Recording]]:
    """One loop per team of the spec, on fresh engines, the teams sharing one prompt schedule;
    with `record`, every engine is wrapped in a Recording (the second list, in agent order)."""
    c = spec.cfg
    schedule = PromptSchedule(load_problems(c, c.task.train_split), c.train.prompts_per_step, c.seed)
    root = job_dir(spec)
    loops, recordings = [], []
    for t, team in enumerate(spec.teams):
        engines = [agent_engine(spec, a, i, len(team), root.team(t).path)
                   for i, a in enumerate(team)]
        if record:
            engines = [Recording(e) for e in engines]
            recordings += engines
        agents = [Agent(a.name, cast(Engine, e)) for a, e in zip(team, engines, strict=True)]
        loops.append(TeamLoop(agents, spec.method, spec.settings, schedule, grader(c)))
    return loops, recordings


def phase_seconds(loops: list[TeamLoop], step: int) -> dict[str, float]:
    """Seconds of each of STEP_PHASES in step `step` of the loops, summed over their agents."""
    out = dict.fromkeys(STEP_PHASES, 0.0)
    for loop in loops:
        result = loop.step(step)
        for metrics in result.agent_metrics:
            for phase in PHASES:
                out[phase] += metrics.get(M.phase_seconds(phase), 0.0)
        out["verify"] += result.team_metrics.get(M.phase_seconds("verify"), 0.0)
    return out


class FloorMeter:
    """The floor of what Recording engines were asked since `clear`; the update floor runs on a
    scratch copy of each model with its own AdamW, so the engines' weights are left alone."""

    def __init__(self, engines: list[Recording]) -> None:
        self.engines: list[Recording] = engines
        self.scratch: list[tuple[Any, torch.optim.Optimizer]] = []
        for engine in engines:
            copy_ = copy.deepcopy(engine.model).train()
            self.scratch.append((copy_, torch.optim.AdamW(copy_.parameters(), lr=1e-6)))

    def clear(self) -> None:
        for engine in self.engines:
            engine.calls = Calls()

    def seconds(self) -> dict[str, float]:
        floor = dict.fromkeys(PHASES, 0.0)
        for engine, (copy_, optimizer) in zip(self.engines, self.scratch, strict=True):
            per_forward = getattr(engine.engine, "forward_rows", None)
            for phase, seconds in floor_seconds(engine.model, copy_, optimizer, engine.calls,
                                                per_forward).items():
                floor[phase] += seconds
        return floor

    def step(self, loops: list[TeamLoop], step: int) -> tuple[dict, dict]:
        """(real seconds of each of STEP_PHASES, floor seconds of each of PHASES) of one step
        of the loops whose engines this meter records."""
        self.clear()
        real = phase_seconds(loops, step)
        return real, self.seconds()


def close(loops: list[TeamLoop]) -> None:
    for loop in loops:
        for agent in loop.agents:
            agent.engine.close()


def measure(spec: JobSpec, repeats: int) -> tuple[list[dict], list[dict]]:
    """Real and floor seconds of steps 2 .. repeats + 1 of the spec's teams."""
    if spec.cfg.engine.get("threads"):
        torch.set_num_threads(int(spec.cfg.engine.threads))
    seed_everything(int(spec.cfg.seed))
    loops, engines = team_loops(spec, record=True)
    reals, floors = [], []
    try:
        meter = FloorMeter(engines)
        for step in range(1, repeats + 2):
            real, floor = meter.step(loops, step)
            if step > 1:
                reals.append(real)
                floors.append(floor)
    finally:
        close(loops)
    return reals, floors


def _seconds(s: dict[str, float], phase: str | None) -> float:
    """One phase of a step's seconds; None: the whole step (its floor: the tensor phases')."""
    return s[phase] if phase is not None else sum(s.values())


def print_floor_table(columns: dict[str, tuple[list[dict], list[dict]]]) -> None:
    """Per column (a method's real and floor seconds of each step): each phase's real seconds,
    its floor and real/floor, medians over the steps; total is the whole step, verify (grading:
    no tensor floor) included."""
    print(f"{'phase':<10}" + "".join(f"{name:>9}{'floor':>8}{'ratio':>7}" for name in columns))
    for phase in (*PHASES, "verify", None):
        row = f"{phase or 'total':<10}"
        for reals, floors in columns.values():
            real = statistics.median(_seconds(r, phase) for r in reals)
            if phase == "verify":
                row += f"{real:>9.3f}{'-':>8}{'-':>7}"
                continue
            floor = statistics.median(_seconds(f, phase) for f in floors)
            row += f"{real:>9.3f}{floor:>8.3f}{real / max(floor, 1e-9):>7.2f}"
        print(row)


def floor_report(overrides: list[str], repeats: int = 3) -> int:
    """Print each phase of one step of the cell (default method=hacpo) next to its floor."""
    try:
        cfg = compose(["method=hacpo", "validation.every=0", "eval.at_end=false", *overrides])
        if str(cfg.engine.name) != "local":
            raise ConfigError(f"engine={cfg.engine.name}: the floor bench measures the local "
                              "engine's models in this process; use engine=local")
        spec = validate(cfg)
    except ConfigError as err:
        print_error(err, "hacrl: config error: ")
        return 2
    reals, floors = measure(spec, repeats)
    agents = ", ".join(a.name for a in spec.agents)
    print(f"one {spec.method.name} step on {agents} (scale={spec.cfg.scale.name}, threads="
          f"{torch.get_num_threads()}, median of {repeats}), seconds:")
    print_floor_table({spec.method.name: (reals, floors)})
    return 0
