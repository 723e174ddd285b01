"""Validating a composed job config before anything is created.

`validate(cfg)` turns it into a `JobSpec` or raises one `ConfigError` whose message names the
key, the bad value and the fix. Nothing touches the disk until validation passed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hacrl.algo import METHODS, LossConfig, MethodSpec
from hacrl.algo.registry import AdvantageEstimator, get_advantage, get_borrowed
from hacrl.checkpoint import damaged_weights
from hacrl.config.composition import default_kinds, literal_config
from hacrl.config.identity import config_hash, zoo_seed
from hacrl.config.settings import (
    LoopSettings,
    OptimizerSettings,
    method_settings,
    optimizer_settings,
)
from hacrl.core.errors import ConfigError as ConfigError  # re-exported: callers import it here
from hacrl.core.layout import Layout


@dataclass(frozen=True)
class AgentSpec:
    name: str
    path: str  # local directory (tiny zoo, checkpoint) or hub id (paper scale)


@dataclass(frozen=True)
class JobSpec:
    """A validated job: everything below the config layer reads its settings from here, built
    once by `validate` (the loop `settings`, the engines `settings.loss` and `optimizer`)."""

    cfg: DictConfig  # resolved
    method: MethodSpec
    agents: tuple[AgentSpec, ...]
    settings: LoopSettings
    optimizer: OptimizerSettings
    output_root: Path
    config_hash: str

    @property
    def loss(self) -> LossConfig:
        """The loss every engine trains with: the loop's, the same object."""
        return self.settings.loss

    @property
    def teams(self) -> list[tuple[AgentSpec, ...]]:
        """Agents trained together: all of them (shared rollouts) or each alone."""
        if self.method.shares_rollouts:
            return [self.agents]
        return [(a,) for a in self.agents]


def _get(cfg: DictConfig, key: str) -> Any:
    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=True)
    except Exception as err:  # missing mandatory value or bad interpolation
        raise ConfigError(f"{key}: {err.__class__.__name__}: {str(err).splitlines()[0]}; "
                          f"set it on the command line, e.g. {key}=...") from None
    return value


def model_path(cfg: DictConfig, index: int, name: str, check: bool = True) -> str:
    """Local directory or hub id of catalog model `name` at the config's scale.

    `check` (the default) requires a local model to be there, with its tokenizer.
    """
    catalog = cfg.models
    if name not in catalog:
        raise ConfigError(f"agents[{index}]={name}: not in models/catalog.yaml; known models: "
                          f"{', '.join(catalog)}")
    scale = cfg.scale.name
    entry = catalog[name].get(scale)
    if entry is None:
        raise ConfigError(f"models.{name}.{scale}: no model for scale={scale}; add one to "
                          "experiments/models/catalog.yaml")
    root = cfg.scale.get("model_root")
    path = str(Path(root) / entry) if root else str(entry)
    local = Path(path)
    if check and (root or local.is_absolute() or local.exists()):
        if not (local / "config.json").is_file():
            hint = "build the zoo with `hacrl zoo build`" if scale == "tiny" else "check the path"
            raise ConfigError(f"agents[{index}]={name}: no model at {local} (scale={scale}); {hint}")
        if (damage := damaged_weights(local)) is not None:
            hint = ("rebuild it with `hacrl zoo build --force " + name + "`" if scale == "tiny"
                    else "download it again")
            raise ConfigError(f"agents[{index}]={name}: {damage}; {hint}")
        check_zoo_draw(cfg, index, name, local)
        if not any((local / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
            raise ConfigError(f"agents[{index}]={name}: {local} has no tokenizer "
                              "(tokenizer.json / tokenizer_config.json); save the tokenizer "
                              "next to the model")
    return path


def check_zoo_draw(cfg: DictConfig, index: int, name: str, local: Path) -> None:
    """A zoo model built with another seed than `scale.zoo_seed` is refused (ConfigError): its
    runs would pass for the other draw's cells (same config hash) and be reused or mixed with
    them. Models without a zoo card (hub models, test micro models) are not checked."""
    from hacrl.zoo.cards import zoo_draw

    wanted = zoo_seed(cfg)
    try:
        drawn = zoo_draw(local)
    except ValueError as err:
        raise ConfigError(f"agents[{index}]={name}: {err}") from None
    if drawn is not None and drawn != (wanted or 0):  # null: the identity of the default draw
        given = "null" if wanted is None else wanted
        raise ConfigError(
            f"agents[{index}]={name}: {local} was built with zoo seed {drawn} (its zoo_card.json), "
            f"but scale.zoo_seed={given}: pass scale.zoo_seed={drawn} (jobs on another zoo "
            f"draw are other cells), or point scale.model_root / $HACRL_ZOO_DIR at a zoo built "
            f"with --seed {wanted or 0}")


def validate(cfg: DictConfig) -> JobSpec:
    """Check everything that can be checked before starting; return the job's spec."""
    from hacrl.config.leaves import check_leaf_types
    from hacrl.config.ranges import check_leaf_ranges

    check_leaf_types(cfg, default_kinds())  # every leaf's type first: the checks below rely on it
    check_leaf_ranges(cfg)  # then every leaf's range (hacrl.config.ranges.RANGES)
    method = _method(cfg)
    estimator = _method_functions(method)
    agents = _agents(cfg, method)
    _batch_check(cfg, method, estimator)
    specs = tuple(AgentSpec(a, model_path(cfg, i, a)) for i, a in enumerate(agents))
    _token_budget_check(cfg, specs)
    _vllm_check(cfg, specs)
    _eval_check(cfg)
    _task_check(cfg)
    resolved = literal_config(OmegaConf.to_container(cfg, resolve=True))
    output_root = Layout.at(cfg.output_root).root
    return JobSpec(resolved, method, specs, method_settings(resolved, method),
                   optimizer_settings(resolved), output_root, config_hash(cfg))


def _method(cfg: DictConfig) -> MethodSpec:
    """The registered method `method.name` names."""
    name = _get(cfg, "method.name")
    if name not in METHODS:
        raise ConfigError(f"method.name={name}: unknown method; registered: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def _agents(cfg: DictConfig, method: MethodSpec) -> list[str]:
    """The agents' catalog names: at least one, each once, >= 2 for a method that shares rollouts."""
    agents = list(_get(cfg, "agents"))
    if not agents:
        raise ConfigError("agents=[]: give at least one agent, e.g. pair=size or agents=[qwen3-4b-base]")
    if len(set(agents)) != len(agents):
        raise ConfigError(f"agents={agents}: an agent appears twice; list each model once")
    if method.shares_rollouts and len(agents) < 2:
        raise ConfigError(f"method={method.name} shares rollouts and needs >= 2 agents, got agents={agents}; "
                          "use a pair (e.g. pair=size) or a single-agent method (gspo, grpo)")
    return agents


def _batch_check(cfg: DictConfig, method: MethodSpec, estimator: AdvantageEstimator) -> None:
    """Step, prompt, mini-batch, rollout and token counts: integers, and mini-batches (as the
    method sizes them) dividing a step's prompts into groups its advantage is defined for."""
    name = method.name  # the counts themselves are in range (hacrl.config.ranges)
    prompts, mb = cfg.train.prompts_per_step, cfg.train.minibatch_prompts
    if mb % method.minibatch_divisor:
        raise ConfigError(f"train.minibatch_prompts={mb}: method={name} divides it by "
                          f"{method.minibatch_divisor}; use a multiple of {method.minibatch_divisor}")
    effective = method.update_prompts(mb)
    if prompts % effective:
        raise ConfigError(f"train.minibatch_prompts={mb} (method={name}: {effective} per update) "
                          f"does not divide train.prompts_per_step={prompts}; pick a divisor of {prompts}")
    if method.group_size(cfg.train.rollouts_per_prompt) < estimator.min_group:
        raise ConfigError(f"train.rollouts_per_prompt={cfg.train.rollouts_per_prompt}: a group-relative "
                          f"advantage needs >= {estimator.min_group} rollouts per prompt (method={name}: "
                          f"{method.advantage})")


def _token_budget_check(cfg: DictConfig, agents: tuple[AgentSpec, ...]) -> None:
    """Every response budget the job uses fits each local agent's positions (config.json's
    max_position_embeddings): a longer one would preallocate a KV cache the model was never
    built for (and that may not fit in memory) minutes into the job."""
    from hacrl.config.protocol import Protocol

    budgets = {"rollout.max_new_tokens": int(cfg.rollout.max_new_tokens)}
    if cfg.validation.every:
        budgets["validation.max_new_tokens"] = int(cfg.validation.max_new_tokens)
    if cfg.eval.at_end:
        for protocol in Protocol.in_use(cfg.eval):
            budgets[f"eval.protocols.{protocol.name}.max_new_tokens"] = protocol.max_new_tokens
    # vLLM allocates max_model_len = eval.vllm.max_prompt_tokens + the response budget, and
    # refuses a length past the model's positions (its rollouts and its evaluation alike)
    prompt = int(cfg.eval.vllm.max_prompt_tokens)
    vllm_lengths: dict[str, int] = {}
    if cfg.engine.name == "verl" and str(cfg.engine.rollout.name) == "vllm":
        vllm_lengths["rollout.max_new_tokens"] = int(cfg.rollout.max_new_tokens)
    if cfg.eval.at_end and str(cfg.eval.backend) == "vllm":
        for protocol in Protocol.in_use(cfg.eval):
            vllm_lengths[f"eval.protocols.{protocol.name}.max_new_tokens"] = protocol.max_new_tokens
    for agent in agents:
        card = Path(agent.path) / "config.json"
        if not card.is_file():
            continue  # a hub id: its card is read when the model loads
        try:
            positions = json.loads(card.read_text()).get("max_position_embeddings")
        except (OSError, ValueError):
            continue  # damaged_weights / the loader name what is wrong with the model
        if not isinstance(positions, int):
            continue
        for key, tokens in budgets.items():
            if tokens >= positions:
                raise ConfigError(f"{key}={tokens}: agent {agent.name} ({agent.path}) holds at "
                                  f"most {positions} positions (max_position_embeddings), prompt "
                                  f"included; use a budget below {positions}")
        if vllm_lengths:
            from hacrl.config.vllm_models import check_vllm_length

            check_vllm_length(f"agent {agent.name}", agent.path, prompt, vllm_lengths)


def _vllm_check(cfg: DictConfig, agents: tuple[AgentSpec, ...]) -> None:
    """Every agent the job hands to vLLM (its rollouts, its final evaluation) is one the
    installed vLLM takes (`hacrl.config.vllm_models`): a refusal is one line now, not a
    traceback from vLLM's engine process after the runs exist."""
    uses = []
    if cfg.engine.name == "verl" and str(cfg.engine.rollout.name) == "vllm":
        uses.append(("engine.rollout.name", str(cfg.engine.dtype)))
    if cfg.eval.at_end and str(cfg.eval.backend) == "vllm":
        uses.append(("eval.backend", str(cfg.eval.dtype)))
    if not uses:
        return
    from hacrl.config.vllm_models import check_vllm_model

    for key, dtype in uses:
        for agent in agents:
            check_vllm_model(key, agent.name, agent.path, dtype)


def _method_functions(method: MethodSpec) -> AdvantageEstimator:
    """The registered functions `method` names (its advantage estimator is returned), or one
    ConfigError naming the spec's key and the registered choices."""
    for key, lookup in (("advantage", get_advantage), ("borrowed", get_borrowed)):
        try:
            lookup(getattr(method, key))
        except KeyError as err:
            raise ConfigError(f"method={method.name}: MethodSpec.{key}: {err.args[0]}") from None
    return get_advantage(method.advantage)


def _eval_check(cfg: DictConfig) -> None:
    from hacrl.config.protocol import TASK_DIR, Protocol, evaluated_benchmarks, task_name

    if not _get(cfg, "eval.at_end"):
        return
    Protocol.in_use(_get(cfg, "eval"))
    evaluated_benchmarks(_get(cfg, "eval"))
    for bench in _get(cfg, "eval.benchmarks"):
        if not (TASK_DIR / f"{task_name(bench)}.yaml").is_file():
            raise ConfigError(f"eval.benchmarks: {bench} has no lm-eval task in {TASK_DIR}")


def _task_check(cfg: DictConfig) -> None:
    from hacrl.data.tasks import check_task

    check_task(cfg)
