"""What a job does with a team's training events (`hacrl.training.events`): one listener per concern.

`StepMetrics` logs every agent's step metrics into its MLflow run, `Validation` runs the greedy
validation when it is due, `Checkpointing` saves the team when a checkpoint is due, `Progress`
moves the progress bar, `JobLog` writes readable lines for a log file and reports the job's
phase and step (a sweep cell's state, which `hacrl sweep` and `hacrl status` show). Each reacts to its own events and ignores the others.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hacrl.checkpoint import team as checkpoint
from hacrl.core import faults
from hacrl.core.errors import StoreError
from hacrl.core.eta import log_line
from hacrl.core.layout import TeamDir
from hacrl.data.problem import Problem
from hacrl.data.tasks import Grader
from hacrl.evaluation.greedy import greedy_accuracy, render_prompts
from hacrl.schema import metric_names as M
from hacrl.tracking import Tracker
from hacrl.training.events import (
    CheckpointDue,
    Event,
    Failed,
    Finished,
    StepDone,
    Stopped,
    TrainingStarts,
    ValidationDue,
)
from hacrl.training.loop import Agent, TeamLoop


class StepMetrics:
    """Each agent's metrics of a step (the team's added, and the seconds since training
    started as `time/wall_s`) into the agent's run, at that step.

    Steps are written in batches: one MLflow write per agent for several steps costs about a
    third of one write per step (each write is a SQLite transaction: ~17 ms for a tiny step's
    ~50 metrics, ~1.3 s of a 25-step tiny cell). The buffer is written when `flush_s` seconds
    have passed since the last write (so the UI's curves stay live; a paper-scale step takes
    minutes, so every step is written at once), at every validation, before every checkpoint
    (a resumed run copies the curves up to its checkpoint step from the killed run), and when
    training ends or fails.
    """

    def __init__(self, tracker: Tracker, agent_runs: dict[str, str], agents: Sequence[str],
                 flush_s: float = 5.0) -> None:
        self.tracker, self.agent_runs, self.agents = tracker, agent_runs, list(agents)
        self.started = self.flushed = time.perf_counter()
        self.flush_s = flush_s
        self.pending: dict[str, list[tuple[int, dict[str, float], int]]] = {}

    def __call__(self, event: Event) -> None:
        if isinstance(event, TrainingStarts):
            self.started = time.perf_counter()
        elif isinstance(event, StepDone):
            result, when = event.result, int(time.time() * 1000)
            for name, metrics in zip(self.agents, result.agent_metrics, strict=True):
                metrics.update(result.team_metrics)
                metrics[M.WALL] = time.perf_counter() - self.started
                self.pending.setdefault(self.agent_runs[name], []).append(
                    (event.step, metrics, when))
            if time.perf_counter() - self.flushed >= self.flush_s:
                self.flush()
        elif isinstance(event, Failed):
            try:
                self.flush()
            except StoreError:
                pass  # the store's fault is the error the job ends with: said once, there
            except Exception as err:  # the training error is the one to report
                print(f"hacrl: the last steps' metrics were not logged: {err}", file=sys.stderr)
        elif isinstance(event, ValidationDue | CheckpointDue | Finished):
            self.flush()

    def flush(self) -> None:
        for run_id, steps in self.pending.items():
            self.tracker.log_steps(run_id, steps)
        self.pending = {}
        self.flushed = time.perf_counter()


class Validation:
    """Greedy accuracy of every agent on the validation benchmark, into its run; `seconds`
    adds up the time it took. Each agent's prompts are rendered at its first validation and
    kept (the same problems and tokenizer every time: the chat template ran once per problem
    and validation, ~7% of a tiny validation's time)."""

    def __init__(self, agents: Sequence[Agent], problems: Sequence[Problem], benchmark: str,
                 template: str, max_new_tokens: int, grade: Grader, tracker: Tracker,
                 agent_runs: dict[str, str]) -> None:
        self.agents, self.problems, self.metric = list(agents), list(problems), M.validation(benchmark)
        self.template, self.max_new_tokens, self.grade = template, max_new_tokens, grade
        self.tracker, self.agent_runs = tracker, agent_runs
        self.seconds = 0.0
        self.prompts: dict[str, list[list[int]]] = {}
        self.last: dict[str, float] = {}  # accuracy per agent at the latest validation

    def __call__(self, event: Event) -> None:
        if not isinstance(event, ValidationDue):
            return
        tic = time.perf_counter()
        self.last = {}
        for agent in self.agents:
            if agent.name not in self.prompts:
                self.prompts[agent.name] = render_prompts(agent.engine.tokenizer, self.problems,
                                                          self.template)
            acc = greedy_accuracy(agent.engine, self.problems, self.template, self.max_new_tokens,
                                  self.grade, self.prompts[agent.name])
            self.tracker.log_metrics(self.agent_runs[agent.name], {self.metric: acc}, event.step)
            self.last[agent.name] = acc
        self.seconds += time.perf_counter() - tic


class Checkpointing:
    """The team (every agent's engine and the loop's state) saved when a checkpoint is due."""

    def __init__(self, team: TeamDir, agents: Sequence[Agent], loop: TeamLoop) -> None:
        self.team, self.agents, self.loop = team, list(agents), loop

    def __call__(self, event: Event) -> None:
        if not isinstance(event, CheckpointDue):
            return

        def save_agents(folder: Path) -> None:
            for agent in self.agents:
                agent.engine.save(folder / agent.name)

        checkpoint.save(self.team.ckpt, event.step, save_agents, self.loop.state_dict())
        if event.final:
            faults.point("final_checkpoint")


class Progress:
    """The job's progress bar: one tick a step, each agent's mean reward beside it."""

    def __init__(self, bar: Any, agents: Sequence[str]) -> None:
        self.bar, self.agents = bar, list(agents)

    def __call__(self, event: Event) -> None:
        if isinstance(event, TrainingStarts):
            self.bar.update(event.step)  # the steps a resumed team had done already
        elif isinstance(event, StepDone):
            rewards = zip(self.agents, event.result.agent_metrics, strict=True)
            self.bar.set_postfix_str(" ".join(f"{a}={m[M.REWARD_MEAN]:.2f}" for a, m in rewards))
            self.bar.update(1)


Report = Callable[[dict[str, Any]], None]  # the job's phase and step, for whoever watches


class JobLog:
    """One readable line per step (each agent's mean reward, seconds per step) and per
    validation (each agent's accuracy), on stdout (a sweep cell's log file), and the job's
    progress as `{"phase": "training", "step": k, "steps": N}` to `report`. Listed after
    `Validation`, whose results it prints."""

    def __init__(self, agents: Sequence[str], steps: int, validation: Validation,
                 report: Report, team: str = "") -> None:
        self.agents, self.steps, self.validation = list(agents), steps, validation
        self.report, self.team = report, team
        self.tic = time.perf_counter()

    def __call__(self, event: Event) -> None:
        if isinstance(event, TrainingStarts):
            self.tic = time.perf_counter()
            self.report({"phase": "training", "step": event.step, "steps": self.steps})
            if event.step:
                self._say(f"resumed at step {event.step}/{self.steps}")
        elif isinstance(event, StepDone):
            seconds, self.tic = time.perf_counter() - self.tic, time.perf_counter()
            rewards = zip(self.agents, event.result.agent_metrics, strict=True)
            self._say(f"step {event.step}/{self.steps}  reward "
                      + "  ".join(f"{a} {m[M.REWARD_MEAN]:.3f}" for a, m in rewards)
                      + f"  ({seconds:.1f} s)")
            self.report({"phase": "training", "step": event.step, "steps": self.steps})
        elif isinstance(event, ValidationDue) and self.validation.last:
            self._say(f"validation at step {event.step}: {self.validation.metric} "
                      + "  ".join(f"{a} {v:.3f}" for a, v in self.validation.last.items()))
            self.tic = time.perf_counter()  # the next step's seconds are its own
        elif isinstance(event, Stopped):
            self._say(f"stopped after step {event.step}/{self.steps} with a checkpoint: SLURM "
                      "asked this job to make way (time limit or preemption); it is requeued")
        elif isinstance(event, Failed):
            self._say(f"failed at step {event.step}: {type(event.error).__name__}: "
                      f"{str(event.error).strip().splitlines()[0] if str(event.error).strip() else ''}")

    def _say(self, line: str) -> None:
        log_line(f"{self.team}{line}")


class DegenerateWarning:
    """The first step with a prompt whose rewards have no spread but whose advantage is not 0
    (`algo.degenerate_prompts`; the bare profile's HACPO) is one line in the job's log, on
    stderr; each step's count and largest |A| are the agents' `adv/` metrics."""

    def __init__(self, agents: Sequence[str]) -> None:
        self.agents, self.warned = list(agents), False

    def __call__(self, event: Event) -> None:
        if self.warned or not isinstance(event, StepDone):
            return
        hits = [(a, m) for a, m in zip(self.agents, event.result.agent_metrics, strict=True)
                if m.get(M.ADV_DEGENERATE_PROMPTS, 0) > 0]
        if hits:
            self.warned = True
            said = ", ".join(f"{a} {m[M.ADV_DEGENERATE_PROMPTS]:.0f} (largest |A| "
                             f"{m[M.ADV_DEGENERATE_MAX_ABS]:.3g})" for a, m in hits)
            from tqdm import tqdm

            # tqdm.write: a line of its own above the job's progress bar
            tqdm.write(f"hacrl: warning: step {event.step}: prompts whose rewards are all equal "
                       f"got a non-zero advantage: {said}; the std is 0, so A = (R - baseline) "
                       f"/ eps (the paper's formula as written; profile=as_run zeroes them). "
                       f"Counted each step as {M.ADV_DEGENERATE_PROMPTS}; warned once",
                       file=sys.stderr)
