"""The training loop for a team of n >= 1 agents, one step at a time, as in the paper:

    generate G samples per prompt (every agent) -> verify all -> capability P, omega
    -> advantages -> source log-probs before any update -> per-target views
    -> mini-batch updates carrying the update index m -> metrics

Engines do the tensor work (`hacrl.engines.base.Engine`); the algorithm is `hacrl.algo`.
A single-agent method is a team of one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from hacrl import algo
from hacrl.algo import AdvantageOptions, LossBatch, MethodSpec
from hacrl.algo.metrics import combine_updates
from hacrl.algo.rollout import (
    TokenView,
    Trajectory,
    own_view,
    render_prompt_ids,
    retokenize,
)
from hacrl.config.settings import LoopSettings
from hacrl.core.telemetry import PhaseTimer
from hacrl.data.problem import Problem
from hacrl.data.tasks import Grader
from hacrl.engines.base import Engine, MiniBatchLoss
from hacrl.schema import metric_names as M


@dataclass
class Agent:
    name: str
    engine: Engine


@dataclass
class StepResult:
    agent_metrics: list[dict[str, float]]
    team_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class StepRows:
    """What the updates of a step need, all computed before any update: per agent, its own
    responses' views and log-probs (and the reference's, or None); per (target, source) pair,
    the source's responses in the target's tokens and (Naive) the target's old log-probs."""

    own_views: list[list[TokenView]]
    own_logp: list[list[Tensor]]
    ref_logp: list[list[Tensor] | None]
    borrowed_views: dict[tuple[int, int], list[TokenView]]
    borrowed_old: dict[tuple[int, int], list[Tensor]]


def prompt_messages(problem: Problem, template: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": template.format(question=problem.question)}]


class PromptSchedule:
    """Which problems step t trains on: a fresh seeded permutation per epoch, no state to save."""

    def __init__(self, problems: Sequence[Problem], per_step: int, seed: int) -> None:
        if not problems:
            raise ValueError("the training split is empty")
        self.problems, self.per_step, self.seed = problems, per_step, seed
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._perms[epoch] = torch.randperm(len(self.problems), generator=gen).tolist()
        return self._perms[epoch]

    def batch(self, step: int) -> list[Problem]:
        """Problems of (1-based) training step `step`."""
        n = len(self.problems)
        first = (step - 1) * self.per_step
        return [self.problems[self._perm(i // n)[i % n]] for i in range(first, first + self.per_step)]


def _seconds(timer: PhaseTimer) -> dict[str, float]:
    """A timer's seconds by phase as metrics (`time/<phase>_s`)."""
    return {M.phase_seconds(phase): s for phase, s in timer.seconds.items()}


def _stats(ratio: str, values: list[Tensor]) -> dict[str, float]:
    """Mean, min and max of sequence ratio `ratio` (M.S_HOMO, M.S_HETE) over a step."""
    v = torch.cat(values) if values else torch.empty(0)
    if v.numel() == 0:
        return {}
    return {M.ratio(ratio, "mean"): float(v.mean()), M.ratio(ratio, "min"): float(v.min()),
            M.ratio(ratio, "max"): float(v.max())}


class TeamLoop:
    """Trains a team of agents together (HACPO, Naive) or one agent alone (GRPO, GSPO)."""

    def __init__(self, agents: list[Agent], method: MethodSpec, settings: LoopSettings,
                 schedule: PromptSchedule, grade: Grader) -> None:
        if method.shares_rollouts and len(agents) < 2:
            raise ValueError(f"method {method.name} shares rollouts and needs >= 2 agents")
        if not method.shares_rollouts and len(agents) != 1:
            raise ValueError(f"method {method.name} trains one agent per team, got {len(agents)}")
        self.agents, self.method, self.settings = agents, method, settings
        self.schedule, self.grade = schedule, grade
        self.capability = algo.CapabilityWindow(len(agents), settings.capability_window,
                                                settings.capability_floor)
        # the method's registered functions (KeyError naming the choices for an unknown name)
        self.advantage, self.borrowed = method.advantage_estimator, method.borrowed_objective
        self.group_size = method.group_size(settings.rollouts_per_prompt)
        self.rows_per_update = method.update_prompts(settings.minibatch_prompts) * self.group_size

    # -- one step -------------------------------------------------------------------------------
    def step(self, step: int) -> StepResult:
        """Training step `step` (1-based), phase by phase; the paper's HACPO steps 1-6 are named
        where a phase carries them out."""
        timers = [PhaseTimer() for _ in self.agents]
        team_timer = PhaseTimer()
        problems = self.schedule.batch(step)
        messages = [prompt_messages(p, self.settings.prompt_template) for p in problems]
        prompt_ids = [[render_prompt_ids(a.engine.tokenizer, m) for m in messages] for a in self.agents]

        # generate: every agent samples G responses per prompt
        trajs = self._generate(problems, messages, prompt_ids, timers)
        # verify: one verifier scores all n * P * G responses
        rewards = self._verify(problems, trajs, team_timer)
        # capability (step 1) and the advantage of every (target, source) sample (steps 2, 3)
        capability = self.capability.update(rewards.mean(dim=(1, 2)))
        omega = algo.omega_matrix(capability, self.settings.omega_clamp)
        advantages = self._advantages(rewards, capability)  # [n_target, n_source, P, G]
        degenerate = algo.degenerate_prompts(rewards, advantages)
        # old log-probs and per-target views (everything the updates need), before any update
        own_views = self._own_views(trajs, prompt_ids)
        own_logp, ref_logp = self._source_log_probs(trajs, own_views, timers)
        borrowed_views = self._borrowed_views(trajs, prompt_ids)
        borrowed_old = self._borrowed_old_log_probs(borrowed_views, timers)
        rows = StepRows(own_views, own_logp, ref_logp, borrowed_views, borrowed_old)

        # updates (steps 4-6 in the loss): each target trains on its own rows and the rows it
        # borrows, mini-batch by mini-batch
        results = []
        for k in range(len(self.agents)):
            metrics = self._train_target(k, step, rows, advantages, omega, timers[k])
            metrics.update(self._agent_metrics(k, trajs[k], rewards, capability, omega, timers[k]))
            metrics[M.ADV_DEGENERATE_PROMPTS] = float(degenerate[0][k])
            metrics[M.ADV_DEGENERATE_MAX_ABS] = float(degenerate[1][k])
            results.append(metrics)
        team = _seconds(team_timer)
        team[M.STEP] = sum(team.values()) + sum(sum(t.seconds.values()) for t in timers)
        return StepResult(results, team)

    def _generate(self, problems: list[Problem], messages: list[list[dict[str, str]]],
                  prompt_ids: list[list[list[int]]], timers: list[PhaseTimer]) -> list[list[Trajectory]]:
        """Step 1: each agent's G responses per prompt, as trajectories [agent][prompt * G]."""
        trajs: list[list[Trajectory]] = []
        for k, agent in enumerate(self.agents):
            with timers[k].phase("generate"):
                groups = agent.engine.generate(prompt_ids[k], self.group_size, self.settings.sampling)
                trajs.append([
                    Trajectory(problems[p].uid, messages[p], agent.engine.decode(g.token_ids), k,
                               g.token_ids, g.finished, source_logprobs=g.logprobs)
                    for p, group in enumerate(groups) for g in group])
        return trajs

    def _verify(self, problems: list[Problem], trajs: list[list[Trajectory]],
                timer: PhaseTimer) -> Tensor:
        """Step 2: grade every response (setting its reward); rewards [n, P, G]."""
        n = len(self.agents)
        with timer.phase("verify"):
            answers = [problems[i // self.group_size].answer for i in range(len(trajs[0]))]
            for k in range(n):
                for t, r in zip(trajs[k], self.grade([t.response_text for t in trajs[k]], answers),
                                strict=True):
                    t.reward = r
        return torch.tensor([[t.reward for t in trajs[k]] for k in range(n)]).view(
            n, len(problems), self.group_size)

    def _own_views(self, trajs: list[list[Trajectory]],
                   prompt_ids: list[list[list[int]]]) -> list[list[TokenView]]:
        """Each agent's responses in its own tokens [agent][row]."""
        return [[own_view(t, prompt_ids[k][i // self.group_size]) for i, t in enumerate(trajs[k])]
                for k in range(len(self.agents))]

    def _source_log_probs(self, trajs: list[list[Trajectory]], own_views: list[list[TokenView]],
                          timers: list[PhaseTimer],
                          ) -> tuple[list[list[Tensor]], list[list[Tensor] | None]]:
        """Step 4: each agent's log-probs of its own responses before any update (recorded on the
        trajectories as their source log-probs), and the reference's when there is a KL term.
        Where the engine's sampler scored its tokens (`Generation.logprobs`), those are the
        own log-probs: the same policy, no second forward."""
        own_logp: list[list[Tensor]] = []
        ref_logp: list[list[Tensor] | None] = []
        for k, agent in enumerate(self.agents):
            with timers[k].phase("logprob"):
                sampled = [t.source_logprobs for t in trajs[k] if t.source_logprobs is not None]
                own_logp.append([torch.tensor(lp) for lp in sampled]
                                if len(sampled) == len(trajs[k])  # the sampler scored them all
                                else agent.engine.log_probs(own_views[k]))
                ref_logp.append(agent.engine.log_probs(own_views[k], reference=True)
                                if self.settings.loss.kl_coef > 0 else None)
            for t, lp in zip(trajs[k], own_logp[k], strict=True):
                t.source_logprobs = lp.tolist()
        return own_logp, ref_logp

    def _borrowed_old_log_probs(self, borrowed_views: dict[tuple[int, int], list[TokenView]],
                                timers: list[PhaseTimer]) -> dict[tuple[int, int], list[Tensor]]:
        """Naive only: the target's own pre-update log-probs of the rows it borrows."""
        borrowed_old: dict[tuple[int, int], list[Tensor]] = {}
        if self.borrowed.as_own:
            for (k, j), views in borrowed_views.items():
                with timers[k].phase("logprob"):
                    borrowed_old[(k, j)] = self.agents[k].engine.log_probs(views)
        return borrowed_old

    def _train_target(self, k: int, step: int, rows: StepRows, advantages: Tensor, omega: Tensor,
                      timer: PhaseTimer) -> dict[str, float]:
        """Step 5 for target k: its rows (own and borrowed), then its mini-batch updates."""
        with timer.phase("update"):
            views, batch, extra = self._target_rows(k, rows, advantages, omega)
            metrics = self._update(k, step, self.agents[k].engine, views, batch)
        metrics.update(extra)
        return metrics

    def _agent_metrics(self, k: int, trajs: list[Trajectory], rewards: Tensor, capability: Tensor,
                       omega: Tensor, timer: PhaseTimer) -> dict[str, float]:
        """Agent k's step metrics besides its updates': reward, P, omega, lengths, time, memory."""
        metrics = {M.REWARD_MEAN: float(rewards[k].mean()), M.CAPABILITY: float(capability[k])}
        for j in range(len(self.agents)):
            if j != k:
                metrics[M.omega(self.agents[j].name)] = float(omega[k, j])
        lengths = torch.tensor([len(t.source_tokens) for t in trajs], dtype=torch.float32)
        metrics[M.RESPONSE_LENGTH_MEAN] = float(lengths.mean())
        metrics[M.RESPONSE_FINISHED_FRAC] = float(np.mean([t.finished for t in trajs]))
        metrics.update(_seconds(timer))
        metrics.update(self.agents[k].engine.memory_metrics())
        return metrics

    def _advantages(self, rewards: Tensor, capability: Tensor) -> Tensor:
        """The method's registered estimator: [n, P, G] rewards -> [n_target, n_source, P, G]."""
        s = self.settings
        options = AdvantageOptions(s.omega_clamp, s.baseline_guard, s.zero_uniform_groups)
        return self.advantage.fn(rewards, capability, options)

    def _borrowed_views(self, trajs: list[list[Trajectory]],
                        prompt_ids: list[list[list[int]]]) -> dict[tuple[int, int], list[TokenView]]:
        if not self.borrowed.partners:
            return {}
        out = {}
        for k, agent in enumerate(self.agents):
            for j in range(len(self.agents)):
                if j != k:
                    out[(k, j)] = [
                        retokenize(t, agent.engine.tokenizer, prompt_ids[k][i // self.group_size],
                                   self.settings.sampling.max_new_tokens, self.settings.overflow)
                        for i, t in enumerate(trajs[j])]
        return out

    def _target_rows(self, k: int, rows: StepRows, advantages: Tensor, omega: Tensor,
                     ) -> tuple[list[TokenView], LossBatch, dict[str, float]]:
        """All rows target k trains on this step, own first, and their loss inputs."""
        own_views, own_logp, ref_logp = rows.own_views, rows.own_logp, rows.ref_logp
        borrowed_views, borrowed_old = rows.borrowed_views, rows.borrowed_old
        views = list(own_views[k])
        old = list(own_logp[k])
        source_mean = [_mean(lp) for lp in own_logp[k]]
        adv = [advantages[k, k].reshape(-1)]
        mod = [torch.ones(len(views))]
        cross = [torch.zeros(len(views), dtype=torch.bool)]
        own = [torch.ones(len(views), dtype=torch.bool)]
        own_ref = ref_logp[k]
        ref = list(own_ref) if own_ref is not None else None
        ratios, truncated = [], 0
        for j in range(len(self.agents)):
            if (k, j) not in borrowed_views:
                continue
            bviews = borrowed_views[(k, j)]
            views.extend(bviews)
            if self.borrowed.as_own:
                olds = borrowed_old[(k, j)]
                means = [_mean(lp) for lp in olds]
            else:
                olds = [torch.zeros(len(v.response_ids)) for v in bviews]
                means = [_mean(lp) for lp in own_logp[j]]
            old.extend(olds)
            source_mean.extend(means)
            adv.append(advantages[k, j].reshape(-1))
            weight = float(omega[j, k]) if self.method.omega_modulation else 1.0
            mod.append(torch.full((len(bviews),), weight))
            cross.append(torch.full((len(bviews),), self.borrowed.term is not None))
            own.append(torch.zeros(len(bviews), dtype=torch.bool))
            if ref is not None:
                ref.extend(torch.zeros(len(v.response_ids)) for v in bviews)
            for bv, sv in zip(bviews, own_views[j], strict=True):
                ratios.append(len(bv.response_ids) / max(1, len(sv.response_ids)))
                truncated += bv.truncated
        width = max(1, max(len(v.response_ids) for v in views))
        batch = LossBatch(
            response_mask=_pad([torch.ones(len(v.response_ids)) for v in views], width),
            old_logp=_pad(old, width),
            source_mean_logp=torch.stack(source_mean),
            advantages=torch.cat(adv).float(),
            omega=torch.cat(mod),
            cross=torch.cat(cross),
            own=torch.cat(own),
            ref_logp=_pad(ref, width) if ref is not None else None,
        )
        extra = {M.TOKENS_OWN: float(sum(len(v.response_ids) for v in own_views[k])),
                 M.TOKENS_BORROWED: float(sum(len(v.response_ids) for v in views[len(own_views[k]):]))}
        if ratios:
            extra[M.RETOK_LENGTH_RATIO] = float(np.mean(ratios))
            extra[M.RETOK_TRUNCATED_FRAC] = truncated / len(ratios)
        return views, batch, extra

    def _order(self, k: int, step: int, batch: LossBatch) -> Tensor:
        """Row order within the step: mixed (seeded shuffle) or own rows first."""
        rows = batch.own.shape[0]
        if self.settings.sample_order == "own_first":
            return torch.cat([torch.nonzero(batch.own).flatten(), torch.nonzero(~batch.own).flatten()])
        if self.settings.sample_order == "mixed":
            gen = torch.Generator().manual_seed(
                (self.settings.seed * 1_000_003 + step) * 101 + k)
            return torch.randperm(rows, generator=gen)
        raise ValueError(f"algo.sample_order must be 'mixed' or 'own_first', got "
                         f"{self.settings.sample_order!r}")

    def _update(self, k: int, step: int, engine: Engine, views: list[TokenView],
                batch: LossBatch) -> dict[str, float]:
        order = self._order(k, step, batch)
        per_update: list[dict[str, float]] = []
        s_homo: list[Tensor] = []
        s_hete: list[Tensor] = []
        kinds: dict[str, str] = {}
        updates = 0
        for m, start in enumerate(range(0, len(views), self.rows_per_update)):
            index = order[start:start + self.rows_per_update]
            loss_fn = MiniBatchLoss(self.settings.loss, update_index=m)
            rows = [views[i] for i in index.tolist()]
            width = max(1, max(len(v.response_ids) for v in rows))
            metrics = engine.train_minibatch(rows, batch.select(index).trim(width), loss_fn)
            for out in loss_fn.outputs:
                s_homo.append(out.s_homo.cpu())
                s_hete.append(out.s_hete.cpu())
            per_update.append(metrics)
            kinds.update(loss_fn.kinds)
            updates += 1
        result = combine_updates(per_update, kinds)
        result[M.UPDATES] = float(updates)
        result.update(_stats(M.S_HOMO, s_homo))
        result.update(_stats(M.S_HETE, s_hete))
        return result

    # -- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"capability": self.capability.state_dict(), "rng": rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self.capability.load_state_dict(state["capability"])
        set_rng_state(state["rng"])


def _mean(logp: Tensor) -> Tensor:
    """Mean token log-prob of one response (0 for an empty one)."""
    return logp.mean() if logp.numel() else torch.zeros(())


def _pad(rows: list[Tensor], width: int) -> Tensor:
    out = torch.zeros(len(rows), width)
    for b, row in enumerate(rows):
        out[b, :row.numel()] = row
    return out


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


__all__ = ["Agent", "PromptSchedule", "StepResult", "TeamLoop", "combine_updates",
           "seed_everything"]
