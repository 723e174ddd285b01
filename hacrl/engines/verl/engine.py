"""`VerlEngine`: one agent's policy on GPUs through verl, behind hacrl's `Engine` interface.

Per agent: one Ray worker group of `HacrlActorRolloutRefWorker` (FSDP actor, optional
reference, and the vLLM rollout in the same processes) and its vLLM server replicas. The loop
is the local engine's loop (`hacrl.loop.TeamLoop`); this adapter turns its calls into verl's:

    generate     -> sync weights actor -> vLLM (wakes the rollout), generate, put it to sleep
    log_probs    -> worker_group.compute_log_prob / compute_ref_log_prob
    train_minibatch -> worker_group.update_actor with HACPO's per-row fields and update index m
    save / load  -> verl's FSDP checkpointing (+ a Hugging Face copy for evaluation)

All agents of a job share one Ray cluster (`VerlCluster`): `placement=colocate` puts every
agent's workers on the same GPUs (one resource pool, several processes per GPU; FSDP
offload and rollout sleep keep only one phase resident), `placement=split` gives each agent its
own GPUs. Replica ranks are offset per agent (`workers.offset_replica_class`).

This module needs verl and Ray; on GPUs vLLM and CUDA. With `engine.device=cpu` the same
adapter drives the same workers on CPU processes (see `cpu_platform`, `hf_rollout`,
`vllm_cpu`), which is how CI trains through it (tests/test_verl_cpu.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import uuid
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from omegaconf import DictConfig
from torch import Tensor

from hacrl.algo import Denominators, LossBatch, LossConfig
from hacrl.algo.metrics import MAX, MIN, ROW_MEAN
from hacrl.engines.base import Engine, Generation, MiniBatchLoss
from hacrl.engines.verl import batch as vb
from hacrl.engines.verl.parquet import source_name, write_parquet
from hacrl.engines.verl.translate import (
    AgentPlacement,
    agent_verl_config,
    on_cpu,
    placement,
    rollout_name,
    validate_verl_config,
)
from hacrl.engines.verl.worker_loss import (
    DENOMINATORS,
    ROWS,
    UPDATE_INDEX,
    loss_callable,
    reported_metrics,
)
from hacrl.rollout import SamplingParams, TokenView, eos_id

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
        address = connect(cfg.engine.ray, int(cfg.engine.nnodes), int(cfg.engine.gpus_per_node))
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
            ray.init(address=None if address == "local" else address, runtime_env=runtime_env,
                     log_to_driver=True, **extra)
        self.pools: dict[int, Any] = {}
        self.users = 0
        self.groups = 0  # worker groups made: their Ray actor names must differ (hacrl bench
        # runs two teams of the same agents in one cluster)

    def cpus_needed(self) -> int:
        pools = 1 if self.cfg.engine.placement == "colocate" else self.n_agents
        return pools * self.placement.world_size * self.colocate_count

    @property
    def colocate_count(self) -> int:
        # processes per GPU: every colocated agent's worker plus room for verl's helpers
        # (its trainer keeps 3 for actor/rollout, ref/critic, reward)
        return max(3, self.n_agents + 1)

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


class VerlEngine(Engine):
    """One agent through verl; built by `make_engine("verl", ..., context=EngineContext)`."""

    standalone: Any = None  # vLLM on CPU: hacrl.engines.verl.vllm_cpu.StandaloneVllm

    def __init__(self, model_path: str, *, context: Any, temperature: float = 1.0,
                 chunk_rows: int = 512, **_: Any) -> None:
        import ray
        from transformers import AutoTokenizer
        from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup

        from hacrl.engines.verl.workers import worker_classes

        cfg: DictConfig = context.cfg
        self.context, self.temperature, self.chunk_rows = context, temperature, chunk_rows
        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_path)
        self.stop_ids = stop_token_ids(model_path, self.tokenizer)
        self.cluster = VerlCluster.get(cfg, context.n_agents)
        self.config = agent_verl_config(context, model_path)
        validate_verl_config(self.config)
        if not Path(str(self.config.data.train_files)).is_file():  # for verl's own tools
            write_parquet(cfg.data, source_name(cfg.data, str(cfg.task.train_split)),
                          out=Path(str(self.config.data.train_files)))
        self.uses_reference = bool(self.config.actor_rollout_ref.actor.use_kl_loss)
        self.rollout = str(self.config.actor_rollout_ref.rollout.name)
        worker = worker_classes()[1]
        role = "actor_rollout_ref" if self.uses_reference else "actor_rollout"
        pool = self.cluster.pool(context.agent_index)
        workers_cls = RayClassWithInitArgs(cls=ray.remote(worker),
                                           config=self.config.actor_rollout_ref, role=role)
        # the group's methods (init_model, update_actor, ...) are bound from the worker class
        # at runtime, hence Any. worker_env per worker too: a Ray cluster started elsewhere
        # (engine.ray.address) has its own job environment
        self.cluster.groups += 1
        self.workers: Any = cast(Any, RayWorkerGroup(
            resource_pool=pool, name_prefix=f"hacrl_{context.agent_index}_g{self.cluster.groups}_",
            ray_cls_with_init=workers_cls, device_name="cpu" if self.cluster.on_cpu else "cuda",
            worker_env=dict(self.cluster.worker_env)))
        self.workers.init_model()
        self.loss_config: LossConfig | None = None
        self._use_loss(context.loss)
        self.world_size = int(self.workers.world_size)
        if self.rollout != "hf":
            self._start_rollout(pool)
        self.version = 0  # optimizer updates so far (the weight version vLLM serves)
        self.peak_gb: dict[str, float] = {}
        self.row_multiple = row_multiple(self.config, self.world_size)

    def _start_rollout(self, pool: Any) -> None:
        if self.cluster.on_cpu:
            # vLLM on CPU: verl's replica STANDALONE (vLLM-CPU has no sleep mode, so no hybrid
            # engine); the actor's weights are pushed before a rollout (_generate_standalone)
            from hacrl.engines.verl.vllm_cpu import StandaloneVllm  # config checked vllm is there

            self.standalone = StandaloneVllm(
                self.config, str(self.config.actor_rollout_ref.model.path),
                self.context.agent_index, replicas=CPU_VLLM_REPLICAS)
            self.served_version: int | None = 0  # the replicas loaded the initial weights
            return
        from verl.checkpoint_engine import CheckpointEngineManager
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.rollout.llm_server import LLMServerManager
        from verl.workers.rollout.replica import get_rollout_replica_class

        from hacrl.engines.verl.workers import offset_replica_class

        rollout = self.config.actor_rollout_ref.rollout
        replica_size = int(rollout.tensor_model_parallel_size) * int(rollout.data_parallel_size) \
            * int(rollout.pipeline_model_parallel_size)
        offset = self.context.agent_index * (self.world_size // replica_size)
        self.workers.offset_replica_rank(offset)

        class Servers(LLMServerManager):  # type: ignore[misc, valid-type]
            rollout_replica_class = offset_replica_class(
                get_rollout_replica_class(str(rollout.name)), offset)

        self.servers = Servers.create(config=self.config, worker_group=self.workers,
                                      rollout_resource_pool=pool, start_rank=offset)
        ce = omega_conf_to_dataclass(rollout.checkpoint_engine)
        ce.backend = "naive"  # colocated actor and rollout: in-process weight sync
        self.weights = CheckpointEngineManager(config=ce, actor_wg=self.workers,
                                               replicas=self.servers.get_replicas())
        self.weights.sleep_replicas()

    # -- sampling ---------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], n: int,
                 sampling: SamplingParams) -> list[list[Generation]]:
        if self.rollout == "hf":
            return self._generate_hf(prompt_ids, n, sampling)
        if self.standalone is not None:
            return self._generate_standalone(prompt_ids, n, sampling)
        # every rollout starts from the actor's current weights: the sleeping vLLM dropped its
        # copy (free_cache_engine), and the sync wakes it up
        self.weights.update_weights(global_steps=self.version)
        try:
            outputs = asyncio.run(self._generate_all(prompt_ids, n, sampling))
        finally:
            self.weights.sleep_replicas()
        return [[_generation(tokens, self.stop_ids) for tokens in outputs[p * n:(p + 1) * n]]
                for p in range(len(prompt_ids))]

    def _generate_hf(self, prompt_ids: list[list[int]], n: int,
                     sampling: SamplingParams) -> list[list[Generation]]:
        """rollout=hf: verl's own weight sync (naive: the actor's full tensors into each
        worker's HF copy), then every rank samples its share of the rows (row i on rank
        i mod world). The seed is a function of the job seed, the agent and the weight
        version, so a resumed job draws the same rollouts."""
        import ray

        ray.get(self.workers.update_weights(global_steps=self.version, mode="naive"))
        seed = self._rollout_seed()
        shares = self.workers.hf_generate(
            prompt_ids, n, dataclasses.asdict(sampling), seed, self._pad_id,
            eos_id(self.tokenizer))
        world = len(shares)
        rows = [shares[i % world][i // world] for i in range(len(prompt_ids) * n)]
        return [[_generation(tokens, self.stop_ids) for tokens, _ in rows[p * n:(p + 1) * n]]
                for p in range(len(prompt_ids))]

    def _rollout_seed(self) -> int:
        """Sampling seed of this agent's next rollout: job seed, agent, weight version."""
        return (int(self.context.cfg.seed) * 1_000_003 + self.context.agent_index * 7919
                + self.version) % 2**31

    def _generate_standalone(self, prompt_ids: list[list[int]], n: int,
                             sampling: SamplingParams) -> list[list[Generation]]:
        """vLLM on CPU: when the actor's weights changed since the replicas' last update, the
        actor writes them as safetensors and vLLM reloads them; then n samples per prompt,
        seeded like _generate_hf (job seed, agent, weight version)."""
        if self.served_version != self.version:
            folder = Path(str(self.config.trainer.default_local_dir)).resolve() / "rollout_weights"
            self.workers.save_hf_weights(str(folder))
            self.standalone.update_weights(folder, self.version)
            self.served_version = self.version
        seed = self._rollout_seed()
        rows = self.standalone.generate(prompt_ids, n, sampling, seed)
        return [[_generation(tokens, self.stop_ids) for tokens in rows[p * n:(p + 1) * n]]
                for p in range(len(prompt_ids))]

    async def _generate_all(self, prompt_ids: list[list[int]], n: int,
                            sampling: SamplingParams) -> list[list[int]]:
        client = self.servers.get_client()
        params = {"temperature": 0.0 if sampling.greedy else sampling.temperature,
                  "top_p": 1.0 if sampling.greedy else sampling.top_p, "top_k": -1,
                  "max_tokens": sampling.max_new_tokens, "logprobs": False}

        async def one(ids: list[int]) -> list[int]:
            out = await client.generate(uuid.uuid4().hex, prompt_ids=ids, sampling_params=params)
            return list(out.token_ids)

        return list(await asyncio.gather(*(one(ids) for ids in prompt_ids for _ in range(n))))

    # -- log-probs ----------------------------------------------------------------------------
    def log_probs(self, views: list[TokenView], reference: bool = False) -> list[Tensor]:
        from verl.utils import tensordict_utils as tu

        if reference and not self.uses_reference:
            raise RuntimeError("no reference policy: the KL term is off (kl_coef = 0)")
        out: list[Tensor] = []
        for start in range(0, len(views), self.chunk_rows):
            chunk = views[start:start + self.chunk_rows]
            rows, _ = vb.pad_rows(list(chunk), {}, self.row_multiple)
            data = vb.to_tensordict(rows, self._pad_id, meta={
                "calculate_entropy": False, "compute_loss": False,
                "temperature": self.temperature})
            call = self.workers.compute_ref_log_prob if reference else self.workers.compute_log_prob
            result = call(data)  # blocking: the collected TensorDict
            padded = vb.response_logprobs(tu.get(result, "log_probs"), data)
            out.extend(vb.split_logprobs(padded, chunk))
        return out

    # -- training -----------------------------------------------------------------------------
    def train_minibatch(self, views: list[TokenView], batch: LossBatch,
                        loss_fn: MiniBatchLoss) -> dict[str, float]:
        from verl.utils import tensordict_utils as tu

        self._use_loss(loss_fn.config)
        width = max(1, max(len(v.response_ids) for v in views))
        sizes = Denominators.of(batch)
        rows, fields = vb.pad_rows(list(views), vb.loss_fields(batch, width), self.row_multiple)
        meta = {UPDATE_INDEX: loss_fn.update_index,
                DENOMINATORS: (sizes.rows, sizes.tokens, sizes.own_tokens),
                "global_batch_size": len(rows), "mini_batch_size": len(rows), "epochs": 1,
                "seed": int(self.context.cfg.seed), "dataloader_kwargs": {"shuffle": False},
                "compute_loss": True, "calculate_entropy": False,
                "distillation_use_topk": False, "distillation_only": False,
                "temperature": self.temperature}
        result = self.workers.update_actor(vb.to_tensordict(rows, self._pad_id, fields, meta))
        self.version += 1
        metrics = actor_metrics(tu.get(result, "metrics"), self.metric_kinds)
        loss_fn.kinds.update({k: v for k, v in self.metric_kinds.items() if k in metrics})
        for key in ("allocated", "reserved"):
            value = metrics.get(f"verl/actor/perf/max_memory_{key}_gb")
            if value is not None:
                self.peak_gb[key] = max(self.peak_gb.get(key, 0.0), value)
        return metrics

    def _use_loss(self, config: LossConfig) -> None:
        """The workers train with `config` (installed once; again only if the loop hands a
        different one): the loss is what the loop's `MiniBatchLoss` says, as in the local engine,
        never a stale copy. The metrics' kinds come with it."""
        if config != self.loss_config:
            self.workers.set_loss_fn(loss_callable(config))
            self.loss_config, self.metric_kinds = config, reported_metrics(config)

    def memory_metrics(self) -> dict[str, float]:
        """Peak GPU memory of the actor workers (torch's allocated / reserved, from verl's
        metrics), and reserved as a fraction of one GPU (Table 8 at paper scale). vLLM's own
        memory is not in torch's counters; the rollout sleeps while the actor trains.
        On CPU: the workers' peak resident memory (what the CPU platform reports to verl)."""
        out = {}
        if self.cluster.on_cpu:
            if "allocated" in self.peak_gb:
                out["memory/peak_rss_gb"] = self.peak_gb["allocated"]
            return out
        if "allocated" in self.peak_gb:
            out["memory/torch_max_allocated_gb"] = self.peak_gb["allocated"]
        if "reserved" in self.peak_gb and torch.cuda.is_available():
            total = torch.cuda.get_device_properties(0).total_memory / 2**30
            out["memory/device_used_frac"] = self.peak_gb["reserved"] / total
        return out

    # -- state --------------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.workers.save_checkpoint(local_path=str((directory / "verl").resolve()),
                                     global_step=self.version, max_ckpt_to_keep=None)
        (directory / "engine.json").write_text(json.dumps({"version": self.version}))
        true_dtype(directory / "verl" / "huggingface")
        link = directory / "model"  # the Hugging Face copy evaluation reads
        if not link.exists():
            os.symlink(Path("verl") / "huggingface", link)

    def load(self, directory: Path) -> None:
        self.workers.load_checkpoint(local_path=str((directory / "verl").resolve()))
        self.version = int(json.loads((directory / "engine.json").read_text())["version"])
        self.served_version = None  # the standalone replicas (CPU vLLM) need the loaded weights

    def close(self) -> None:
        if self.standalone is not None:
            self.standalone.close()
            self.standalone = None
        self.cluster.release()

    @property
    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad) if pad is not None else eos_id(self.tokenizer)


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


SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def true_dtype(hf_dir: Path) -> None:
    """verl writes `dtype: bfloat16` into its Hugging Face copy's config whatever the tensors
    are (verl/utils/checkpoint/fsdp_checkpoint_manager.py:445-446 builds the model to save in
    bf16, then saves the full fp32 state dict): a reader loading with the config's dtype would
    round an fp32 run's weights to bf16. Make the config say what the tensors are."""
    import struct

    weights, config = hf_dir / "model.safetensors", hf_dir / "config.json"
    if not weights.is_file() or not config.is_file():
        return  # sharded or absent: leave verl's copy as it is
    with weights.open("rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    if len(dtypes) != 1 or next(iter(dtypes)) not in SAFETENSORS_DTYPES:
        return
    settings = json.loads(config.read_text())
    settings["dtype"] = SAFETENSORS_DTYPES[dtypes.pop()]
    config.write_text(json.dumps(settings, indent=2) + "\n")


def stop_token_ids(model_path: str, tokenizer: Any) -> frozenset[int]:
    """Every id vLLM stops on: the tokenizer's EOS and the generation config's eos_token_id
    (vLLM adds those to the stop ids; e.g. Qwen3 <|im_end|> and <|endoftext|>)."""
    from transformers import GenerationConfig

    stops = {eos_id(tokenizer)}
    try:
        extra = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        extra = None
    if extra is not None:
        stops.update([extra] if isinstance(extra, int) else extra)
    return frozenset(int(i) for i in stops)


def _generation(tokens: list[int], stops: frozenset[int]) -> Generation:
    """A response ends at its first stop token (kept, as vLLM returns it) or is unfinished
    (the token budget, or vLLM's clamp to the model's context, cut it)."""
    for i, token in enumerate(tokens):
        if token in stops:
            return Generation(tokens[:i + 1], True)
    return Generation(list(tokens), False)


def row_multiple(config: Any, world_size: int) -> int:
    """Rows every worker-group call is padded to: the data-parallel ranks times, unless
    micro-batches are sized by tokens, a common multiple of the actor's, the rollout's and the
    reference's micro-batch sizes (each rank must hold whole micro-batches)."""
    a = config.actor_rollout_ref
    if a.actor.use_dynamic_bsz:
        return world_size
    sizes = [a.actor.ppo_micro_batch_size_per_gpu, a.rollout.log_prob_micro_batch_size_per_gpu,
             a.ref.log_prob_micro_batch_size_per_gpu]
    return world_size * math.lcm(*(int(s) for s in sizes if s))


def actor_metrics(raw: dict[str, Any], kinds: dict[str, str] | None = None) -> dict[str, float]:
    """verl's update metrics in the local engine's names; verl's own under `verl/actor/`.

    Ours are the metrics the loss callable reports (`kinds`, by default those of HACPO's loss:
    `worker_loss.reported_metrics`), read by their declared kind: SHARE sums of micro-batch
    shares are the mini-batch's values; ROW_MEAN sums of value x rows are divided by the row
    count (row-weighted means, as the local engine reports them); SUM / COUNT / MIN / MAX stay
    for the loop to combine over a step's updates (`hacrl.algo.metrics.combine_updates`), an
    infinite extreme (no such rows) left out."""
    kinds = reported_metrics(LossConfig()) if kinds is None else kinds
    flat = {k: _mean(v) for k, v in raw.items()}
    rows = flat.pop(ROWS, 0.0)
    out: dict[str, float] = {}
    for key, value in flat.items():
        kind = kinds.get(key)
        if kind is None:
            out[key if key == "grad_norm" else f"verl/actor/{key}"] = value
        elif kind == ROW_MEAN:
            if rows > 0:
                out[key] = value / rows
        elif not (kind in (MIN, MAX) and math.isinf(value)):
            out[key] = value
    return out


def _mean(value: Any) -> float:
    if isinstance(value, list | tuple):
        values = [float(v) for v in value]
        return sum(values) / len(values) if values else 0.0
    if isinstance(value, torch.Tensor):
        return float(value.float().mean())
    return float(value)


__all__ = ["VerlCluster", "VerlEngine", "actor_metrics"]
