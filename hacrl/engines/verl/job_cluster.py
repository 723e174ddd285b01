"""The job's Ray cluster (`VerlCluster`): one per process, shared by the job's agents.

It sets the environment every verl process needs before `import verl` (the CPU platform, the
hf rollout's registration: `verl_environment`), connects to or starts Ray
(`ray_cluster.connect`), and hands out the agents' resource pools: `placement=colocate` puts
every agent's workers on the same GPUs (one pool, several processes per GPU), `placement=split`
gives each agent its own. The last agent to release it shuts Ray down and puts the environment
back as it was.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from omegaconf import DictConfig

from hacrl.engines.verl.translate import AgentPlacement, on_cpu, placement, rollout_name

CPU_VLLM_REPLICAS = 1  # engine.device=cpu, rollout.name=vllm: standalone vLLM replicas per agent


class VerlCluster:
    """The Ray cluster and resource pools of this process, shared by a job's agents."""

    current: ClassVar[VerlCluster | None] = None

    def __init__(self, cfg: DictConfig, n_agents: int) -> None:
        import ray

        from hacrl.engines.verl.ray_cluster import connect

        self.cfg, self.n_agents = cfg, n_agents
        self.on_cpu = on_cpu(cfg)
        # what every worker needs before `import verl` (the CPU platform, the hf rollout); set
        # here too (the driver), and put back as it was when the cluster goes
        from verl.plugin.platform import platform_manager

        self.worker_env = verl_environment(cfg)
        self.saved_env = {key: os.environ.get(key) for key in self.worker_env}
        self.saved_platform = platform_manager._current_platform
        os.environ.update(self.worker_env)
        activate_plugins(cfg)
        self.placement: AgentPlacement = placement(cfg, n_agents)
        gpus, cpus = ray_node_shape(cfg, n_agents)
        address = connect(cfg.engine.ray, int(cfg.engine.nnodes), gpus, cpus_per_node=cpus)
        if not ray.is_initialized():
            from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

            # verl's own worker environment (e.g. VLLM_DISABLE_COMPILE_CACHE: several vLLM
            # engines per job must not share a compile cache)
            runtime_env = dict(get_ppo_ray_runtime_env())
            runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **self.worker_env}
            extra: dict[str, Any] = {}
            if self.on_cpu and address == "local":
                # Ray's CPU resources are logical: every pool bundle reserves
                # max_colocate_count of them per worker, whatever the cores
                extra = {"num_cpus": max(os.cpu_count() or 1, self.cpus_needed()), "num_gpus": 0,
                         "include_dashboard": False}
                if rollout_name(cfg) == "vllm":
                    # standalone vLLM replicas (hacrl.engines.verl.vllm_cpu): one fake GPU
                    # each (verl's replica launch reserves and reads a GPU), a few CPUs more
                    from hacrl.engines.verl.vllm_cpu import ray_resources

                    more = ray_resources(n_agents * CPU_VLLM_REPLICAS)
                    extra["num_gpus"] = more["num_gpus"]
                    extra["num_cpus"] += more["num_cpus"]
            from hacrl.engines.verl.ray_nodes import children_deaf_to_usr2

            with children_deaf_to_usr2():  # Ray's processes outlive SLURM's USR2
                ray.init(address=None if address == "local" else address,
                         runtime_env=runtime_env, log_to_driver=True, **extra)
        self.pools: dict[int, Any] = {}
        self.users = 0
        self.groups = 0  # worker groups made: their Ray actor names must differ (hacrl bench
        # runs two teams of the same agents in one cluster)

    def cpus_needed(self) -> int:
        pools = 1 if self.cfg.engine.placement == "colocate" else self.n_agents
        return pools * self.placement.world_size * self.colocate_count

    @property
    def colocate_count(self) -> int:
        return colocate_count(self.n_agents)

    @classmethod
    def get(cls, cfg: DictConfig, n_agents: int) -> VerlCluster:
        if cls.current is None:
            cls.current = cls(cfg, n_agents)
        cls.current.users += 1
        return cls.current

    def pool(self, agent_index: int) -> Any:
        """The agent's resource pool: one shared pool (colocate) or one per agent (split)."""
        from verl.single_controller.ray import RayResourcePool

        key = 0 if self.cfg.engine.placement == "colocate" else agent_index
        if key not in self.pools:
            where = self.placement
            self.pools[key] = RayResourcePool(
                process_on_nodes=[where.gpus_per_node] * where.nnodes, use_gpu=not self.on_cpu,
                max_colocate_count=self.colocate_count, name_prefix=f"hacrl_pool{key}_")
        return self.pools[key]

    def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            import ray

            ray.shutdown()
            VerlCluster.current = None
            for key, value in self.saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            if self.on_cpu:
                from verl.plugin.platform import platform_manager as pm

                pm._current_platform = self.saved_platform



def colocate_count(n_agents: int) -> int:
    """Processes per GPU: every colocated agent's worker plus room for verl's helpers (its
    trainer keeps 3 for actor/rollout, ref/critic, reward)."""
    return max(3, n_agents + 1)


def team_size(cfg: DictConfig) -> int:
    """The agents one job's cluster serves at a time, as the job builds its teams: all of
    them for a method that shares rollouts, else 1 (each agent trains alone). A worker node
    sizes itself with it before any engine exists."""
    from hacrl.algo import METHODS

    method = METHODS.get(str(cfg.method.name))
    return len(cfg.agents) if method is None or method.shares_rollouts else 1


def ray_node_shape(cfg: DictConfig, n_agents: int) -> tuple[int, int | None]:
    """(GPUs, CPUs) each `ray start` node of a multi-node job declares to Ray.

    On GPUs: engine.gpus_per_node, and the CPUs SLURM gave the task (None). On CPU: no GPUs,
    and exactly the logical CPUs the agents' pools reserve on one node (each worker's bundle
    takes `colocate_count` of them): then no node can hold a second node's bundles, and every
    pool spreads over all the nodes as on GPUs.
    """
    if not on_cpu(cfg):
        return int(cfg.engine.gpus_per_node), None
    pools = 1 if cfg.engine.placement == "colocate" else n_agents
    return 0, pools * placement(cfg, n_agents).gpus_per_node * colocate_count(n_agents)


def verl_environment(cfg: DictConfig) -> dict[str, str]:
    """Environment variables the driver and every worker need before `import verl`: on CPU
    the cpu platform (`cpu_platform.environment`), and the hf rollout's registration."""
    from hacrl.engines.verl import cpu_platform

    plugins = ("hacrl.engines.verl.hf_rollout",) if rollout_name(cfg) == "hf" else ()
    if on_cpu(cfg):
        return cpu_platform.environment(plugins)
    return {"VERL_USE_EXTERNAL_MODULES": ",".join(plugins)} if plugins else {}


def activate_plugins(cfg: DictConfig) -> None:
    """In the driver: import the modules `verl_environment` names (verl may already be
    imported, e.g. by the config check) and make the CPU platform verl's current one."""
    import importlib

    for module in filter(None, verl_environment(cfg).get("VERL_USE_EXTERNAL_MODULES", "").split(",")):
        importlib.import_module(module)
    from verl.plugin.platform import platform_manager as pm

    current = pm._current_platform
    if on_cpu(cfg) and (current is None or current.device_name != "cpu"):
        pm.set_platform(pm.PlatformRegistry._platforms["cpu"]())



__all__ = ["CPU_VLLM_REPLICAS", "VerlCluster", "activate_plugins", "colocate_count",
           "ray_node_shape", "team_size", "verl_environment"]
