"""What a job does with a team's training events (`hacrl.events`): one listener per concern.

`StepMetrics` logs every agent's step metrics into its MLflow run, `Validation` runs the greedy
validation when it is due, `Checkpointing` saves the team when a checkpoint is due, `Progress`
moves the progress bar. Each reacts to its own events and ignores the others.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hacrl import checkpoint, faults
from hacrl.arith import Problem
from hacrl.evaluation.greedy import greedy_accuracy, render_prompts
from hacrl.events import CheckpointDue, Event, StepDone, TrainingStarts, ValidationDue
from hacrl.layout import TeamDir
from hacrl.loop import Agent, TeamLoop
from hacrl.schema import metric_names as M
from hacrl.tasks import Grader
from hacrl.tracking import Tracker


class StepMetrics:
    """Each agent's metrics of a step (the team's added, and the seconds since training
    started as `time/wall_s`) into the agent's run, at that step."""

    def __init__(self, tracker: Tracker, agent_runs: dict[str, str], agents: Sequence[str]) -> None:
        self.tracker, self.agent_runs, self.agents = tracker, agent_runs, list(agents)
        self.started = time.perf_counter()

    def __call__(self, event: Event) -> None:
        if isinstance(event, TrainingStarts):
            self.started = time.perf_counter()
        elif isinstance(event, StepDone):
            result = event.result
            for name, metrics in zip(self.agents, result.agent_metrics, strict=True):
                metrics.update(result.team_metrics)
                metrics[M.WALL] = time.perf_counter() - self.started
                self.tracker.log_metrics(self.agent_runs[name], metrics, event.step)


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

    def __call__(self, event: Event) -> None:
        if not isinstance(event, ValidationDue):
            return
        tic = time.perf_counter()
        for agent in self.agents:
            if agent.name not in self.prompts:
                self.prompts[agent.name] = render_prompts(agent.engine.tokenizer, self.problems,
                                                          self.template)
            acc = greedy_accuracy(agent.engine, self.problems, self.template, self.max_new_tokens,
                                  self.grade, self.prompts[agent.name])
            self.tracker.log_metrics(self.agent_runs[agent.name], {self.metric: acc}, event.step)
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
            self.bar.set_postfix_str(" ".join(f"{a}={m['reward/mean']:.2f}" for a, m in rewards))
            self.bar.update(1)
