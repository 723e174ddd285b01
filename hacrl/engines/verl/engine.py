"""`VerlEngine`: one agent's policy on GPUs through verl, behind hacrl's `Engine` interface.

Per agent: one Ray worker group of `HacrlActorRolloutRefWorker` (FSDP actor, optional
reference, and the vLLM rollout in the same processes) and its vLLM server replicas. The loop
is the local engine's loop (`hacrl.training.loop.TeamLoop`); this adapter turns its calls into verl's:

    generate     -> sync weights actor -> vLLM (wakes the rollout), generate, put it to sleep
    log_probs    -> worker_group.compute_log_prob / compute_ref_log_prob
    train_minibatch -> worker_group.update_actor with HACPO's per-row fields and update index m
    save / load  -> verl's FSDP checkpointing (+ a Hugging Face copy for evaluation)

All agents of a job share one Ray cluster (`job_cluster.VerlCluster`): `placement=colocate`
puts every agent's workers on the same GPUs (one resource pool, several processes per GPU;
FSDP offload and rollout sleep keep only one phase resident), `placement=split` gives each
agent its own GPUs. Replica ranks are offset per agent (`workers.offset_replica_class`).
The pieces: `generation` (the rollout paths), `update_metrics` (verl's update metrics in our
names), `agent_checkpoint` (save / load), `batch` (rows <-> verl's TensorDict).

This module needs verl and Ray; on GPUs vLLM and CUDA. With `engine.device=cpu` the same
adapter drives the same workers on CPU processes (see `cpu_platform`, `hf_rollout`,
`vllm_cpu`), which is how CI trains through it (tests/test_verl_cpu.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any, cast

import torch
from omegaconf import DictConfig
from torch import Tensor

from hacrl.algo import Denominators, LossBatch, LossConfig
from hacrl.algo.rollout import SamplingParams, TokenView, eos_id
from hacrl.engines.base import Engine, Generation, MiniBatchLoss
from hacrl.engines.verl import batch as vb
from hacrl.engines.verl.agent_checkpoint import load_agent, save_agent
from hacrl.engines.verl.generation import (
    generate_on_servers,
    per_prompt,
    refuse_long_prompts,
    rollout_seed,
    rows_from_shares,
    start_vllm_servers,
    stop_token_ids,
)
from hacrl.engines.verl.job_cluster import CPU_VLLM_REPLICAS, VerlCluster
from hacrl.engines.verl.parquet import source_name, write_parquet
from hacrl.engines.verl.ray_nodes import placement_line, worker_faults
from hacrl.engines.verl.translate import agent_verl_config, validate_verl_config
from hacrl.engines.verl.update_metrics import actor_metrics
from hacrl.engines.verl.worker_loss import (
    DENOMINATORS,
    UPDATE_INDEX,
    loss_callable,
    reported_metrics,
)
from hacrl.schema import metric_names as M


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
        if int(cfg.engine.nnodes) > 1:
            print(f"hacrl: {context.agent_name}: {placement_line(self.workers.workers)}",
                  file=sys.stderr, flush=True)
        self.loss_config: LossConfig | None = None
        self._use_loss(context.loss)
        self.world_size = int(self.workers.world_size)
        if self.rollout != "hf":
            self._start_rollout(pool)
        self.version = 0  # optimizer updates so far (the weight version vLLM serves)
        self.peak_gb: dict[str, float] = {}
        self.row_multiple = vb.row_multiple(self.config, self.world_size)

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
        self.servers, self.weights = start_vllm_servers(
            self.config, self.workers, pool, self.context.agent_index, self.world_size)

    # -- sampling ---------------------------------------------------------------------------
    @worker_faults
    def generate(self, prompt_ids: list[list[int]], n: int,
                 sampling: SamplingParams) -> list[list[Generation]]:
        if self.rollout == "hf":
            return self._generate_hf(prompt_ids, n, sampling)
        refuse_long_prompts(self.context.agent_name, prompt_ids,
                            int(self.config.actor_rollout_ref.rollout.prompt_length))
        if self.standalone is not None:
            return self._generate_standalone(prompt_ids, n, sampling)
        # every rollout starts from the actor's current weights: the sleeping vLLM dropped its
        # copy (free_cache_engine), and the sync wakes it up
        self.weights.update_weights(global_steps=self.version)
        try:
            outputs = asyncio.run(generate_on_servers(self.servers, prompt_ids, n, sampling))
        finally:
            self.weights.sleep_replicas()
        return per_prompt(outputs, len(prompt_ids), n, self.stop_ids)

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
        rows = rows_from_shares(shares, len(prompt_ids) * n)
        return per_prompt([tokens for tokens, _ in rows], len(prompt_ids), n, self.stop_ids)

    def _rollout_seed(self) -> int:
        """Sampling seed of this agent's next rollout: job seed, agent, weight version."""
        return rollout_seed(int(self.context.cfg.seed), self.context.agent_index, self.version)

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
        return per_prompt(rows, len(prompt_ids), n, self.stop_ids)

    # -- log-probs ----------------------------------------------------------------------------
    @worker_faults
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
    @worker_faults
    def train_minibatch(self, views: list[TokenView], batch: LossBatch,
                        loss_fn: MiniBatchLoss) -> dict[str, float]:
        from verl.utils import tensordict_utils as tu

        self._use_loss(loss_fn.config)
        width = max(1, max(len(v.response_ids) for v in views))
        sizes = Denominators.of(batch)
        rows, fields = vb.pad_rows(list(views), vb.loss_fields(batch, width), self.row_multiple)
        meta = {UPDATE_INDEX: loss_fn.update_index,
                DENOMINATORS: dataclasses.astuple(sizes),
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
                out[M.PEAK_RSS] = self.peak_gb["allocated"]
            return out
        if "allocated" in self.peak_gb:
            out[M.TORCH_MAX_ALLOCATED] = self.peak_gb["allocated"]
        if "reserved" in self.peak_gb and torch.cuda.is_available():
            total = torch.cuda.get_device_properties(0).total_memory / 2**30
            out[M.DEVICE_USED_FRAC] = self.peak_gb["reserved"] / total
        return out

    # -- state --------------------------------------------------------------------------------
    @worker_faults
    def save(self, directory: Path) -> None:
        save_agent(self.workers, directory, self.version)

    @worker_faults
    def load(self, directory: Path) -> None:
        self.version = load_agent(self.workers, directory)
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


__all__ = ["VerlEngine"]
