"""What a job builds before it trains: where it writes, each agent's engine, the loop's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hacrl.config import AgentSpec, JobSpec
from hacrl.core.layout import Layout, RunDir
from hacrl.engines.base import EngineContext, engine_hook, make_engine


def job_dir(spec: JobSpec) -> RunDir:
    return Layout(spec.output_root).run(spec.config_hash, spec.method.name)


def engine_context(spec: JobSpec, agent: AgentSpec, index: int, team_size: int,
                   root: Path) -> EngineContext:
    """What the engine of agent `index` of a team of `team_size` gets to know about the job."""
    c, method = spec.cfg, spec.method
    group = method.group_size(c.train.rollouts_per_prompt)
    minibatch = method.update_prompts(c.train.minibatch_prompts)
    rows = int(c.train.prompts_per_step) * group * method.row_sources(team_size)
    return EngineContext(cfg=c, agent_name=agent.name, agent_index=index, n_agents=team_size,
                         loss=spec.loss, optimizer=spec.optimizer, group_size=group, minibatch_prompts=minibatch,
                         run_dir=root, updates_per_step=-(-rows // (minibatch * group)))


def agent_engine(spec: JobSpec, agent: AgentSpec, index: int, team_size: int, root: Path) -> Any:
    """The engine (registered under `engine.name`) of agent `index` of a team."""
    c = spec.cfg
    context = engine_context(spec, agent, index, team_size, root)
    return make_engine(c.engine.name, model_path=agent.path, optimizer=context.optimizer,
                       device=c.engine.device,
                       dtype=c.engine.dtype, reference=context.loss.kl_coef > 0,
                       temperature=float(c.rollout.temperature),
                       micro_batch_rows=c.train.micro_batch_rows, chunk_rows=c.engine.chunk_rows,
                       forward_rows=c.engine.get("forward_rows"),
                       old_logprobs=c.engine.get("old_logprobs", "recompute"),
                       context=context)


def before_job(cfg: Any) -> dict[str, Any] | None:
    """The engine's say before a job starts: a summary means "this process does not train"
    (a worker node of a multi-node verl job serves Ray and ends with the cluster)."""
    hook = engine_hook(str(cfg.engine.name), "before_job")
    return hook(cfg) if hook is not None else None


def release_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
