"""engine=verl: the HACPO loop on GPU clusters through verl 0.9.1 (FSDP actors, vLLM rollouts).

Nothing here imports verl at import time: `hacrl` installs and runs without it, and the pieces
that need it import it inside functions. The parts:

- `batch`: our rows (TokenView + LossBatch) <-> verl's TensorDict layout (no-padding, jagged).
- `worker_loss`: the workers' loss callable; the same `hacrl.algo.policy_loss` as the local engine.
- `workers`: verl worker subclasses that number mini-batches (update index m) for the loss.
- `translate`: our Hydra config -> verl's trainer config, validated by verl's dataclasses.
- `parquet`: MATH train split -> verl's RL parquet schema.
- `ray_cluster`: Ray inside a SLURM allocation (`connect`); `ray_plan` decides this
  process's part, `ray_nodes` runs the `ray start` processes, `slurm_allocation` reads
  SLURM's variables.
- `engine`: `VerlEngine`, the adapter behind `hacrl.engines.base.Engine`; with it
  `job_cluster` (the job's Ray cluster and resource pools), `generation` (the rollout paths),
  `update_metrics` (verl's update metrics in our names) and `agent_checkpoint` (save / load).
- `cpu_platform`, `hf_rollout`, `vllm_cpu`: the CPU layer (`engine.device=cpu`).
"""

from __future__ import annotations

from typing import Any

from hacrl.engines.base import Engine, register_engine


@register_engine("verl")
def _make_verl_engine(**kwargs: Any) -> Engine:
    from hacrl.engines.verl.engine import VerlEngine

    return VerlEngine(**kwargs)


def describe(context: Any, model_path: str) -> dict[str, Any]:
    """Dry run of one agent: its verl config, built and validated by verl's dataclasses.

    The model section (HFModelConfig, which reads the model's config and tokenizer) is
    validated when the model is a local directory; a hub id is checked at job start.
    """
    from pathlib import Path

    from omegaconf import OmegaConf

    from hacrl.engines.verl.translate import agent_verl_config, validate_verl_config

    v = agent_verl_config(context, model_path)
    local = Path(model_path).is_dir()
    built = validate_verl_config(v, model=local)
    record: dict[str, Any] = {
        "verl_validated": sorted(built),
        "model_validated": local,
        "gpus": f"{v.trainer.nnodes}x{v.trainer.n_gpus_per_node}",
        "rollout_n": int(v.actor_rollout_ref.rollout.n),
        "ppo_mini_batch_size": int(v.actor_rollout_ref.actor.ppo_mini_batch_size),
    }
    team = context.run_dir.name if context.run_dir is not None else "team"
    record["files"] = {"verl_config": (f"{team}/{context.agent_name}.verl.yaml", OmegaConf.to_yaml(v))}
    return record


def before_job(cfg: Any) -> dict[str, Any] | None:
    """On a worker node of a multi-node allocation (SLURM task rank > 0): be a Ray node of
    the head's cluster until it ends, and train nothing (no runs, no run directory)."""
    import os

    from hacrl.engines.verl.job_cluster import ray_node_shape, team_size
    from hacrl.engines.verl.ray_cluster import auth_mode, use_auth_mode
    from hacrl.engines.verl.ray_nodes import serve_as_worker
    from hacrl.engines.verl.ray_plan import plan_from_env

    e = cfg.engine
    # the head declares its node for the team it trains; a worker node the same
    gpus, cpus = ray_node_shape(cfg, team_size(cfg))
    plan = plan_from_env(e.ray, int(e.nnodes), gpus, os.environ, cpus)
    if plan.role != "worker":
        return None
    use_auth_mode(auth_mode(os.environ))  # the head's rule: one mode for every node
    code = serve_as_worker(plan)
    return {"skipped": True, "ray_worker_of": plan.address, "ray_exit_code": code,
            "run_dir": None, "teams": []}

