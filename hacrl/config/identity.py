"""A job's training identity: the parts of its config that decide what is trained, and their
hash (a sweep cell's id, a run's `config_hash` tag). Where it is logged, or which table asked for
it, is not part of it."""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hacrl.algo import METHODS
from hacrl.core.errors import ConfigError

# algo keys that only matter when agents share rollouts (dropped from a single agent's identity,
# so that e.g. the GSPO run of an agent is the same cell whichever pair asked for it)
CROSS_AGENT_KEYS = ("alpha", "cross_clip_lower", "delta_step", "capability_window",
                    "capability_floor", "omega_clamp", "baseline_guard")
# engine.old_logprobs (local engine): own rows' old log-probs from the sampler's logits, or from
# a second forward; only `sampler` enters the identity, so `recompute` keeps the hashes of the
# runs made before the choice existed (their numbers differ at float rounding, then diverge)
OLD_LOGPROBS = ("sampler", "recompute")


def training_identity(cfg: DictConfig) -> dict[str, Any]:
    """The parts of the config that decide what is trained (not where it is logged or why)."""
    keep = ("agents", "method", "algo", "profile", "train", "rollout", "task", "seed",
            "timing_repeat")
    ident: dict[str, Any] = {}
    for key in keep:
        if key in cfg:
            value = cfg[key]
            ident[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    ident["scale"] = cfg.scale.name
    if draw := zoo_seed(cfg):  # another draw of the tiny zoo is other models; 0 keeps old ids
        ident["zoo_seed"] = draw
    ident["engine"] = {"name": cfg.engine.name, "dtype": cfg.engine.dtype}
    if cfg.engine.get("old_logprobs", "recompute") != "recompute":
        ident["engine"]["old_logprobs"] = cfg.engine.old_logprobs
    if "data_dir" in ident.get("task", {}):
        ident["task"].pop("data_dir")
    method = METHODS.get(str(cfg.method.name))
    if method is not None and not method.trains:  # evaluation only: the models are the identity
        return {k: ident[k] for k in ("agents", "method", "seed", "scale", "zoo_seed", "task")
                if k in ident}
    if method is not None and not method.shares_rollouts:
        for key in CROSS_AGENT_KEYS:
            ident.get("algo", {}).pop(key, None)
    if method is None or method.ratio != "token":  # the dual clip bounds token ratios only
        ident.get("algo", {}).pop("dual_clip_c", None)
    return ident


def zoo_seed(cfg: DictConfig) -> int | None:
    """`scale.zoo_seed`: which draw of the tiny zoo the models are (`hacrl zoo build --seed`);
    None at a scale without a zoo."""
    value = cfg.scale.get("zoo_seed")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError(f"scale.zoo_seed={value}: must be an integer >= 0 (the --seed the zoo "
                          "was built with), or null at a scale without a zoo")
    return value


def config_hash(cfg: DictConfig) -> str:
    return _digest(training_identity(cfg))


def seed_group(cfg: DictConfig) -> str:
    """The hash of the training identity without the seed: equal for the seeds of one sweep
    cell (same method, team, settings), the job run's `seed_group` tag. Not a config hash: a
    cell's id is still `config_hash`, which this leaves as it was."""
    return _seed_group(training_identity(cfg))


def seed_group_of_logged(params: Mapping[str, str], logged_hash: str) -> str | None:
    """`seed_group` of a job run logged before job runs carried it, rebuilt from its params
    (the training config, flattened: `hacrl.job.runs.training_params`), or None when the
    params do not rebuild the identity exactly: the rebuilt config must give the run's own
    `config_hash` tag `logged_hash`, else a guess would group runs wrongly."""
    tree: dict[str, Any] = {}
    for name, text in params.items():
        key, *_ = parts = name.split(".")
        if key not in IDENTITY_KEYS:
            continue
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                return None  # `a` and `a.b` both logged: not a flattened config
        node[parts[-1]] = _logged_value(text)
    try:
        cfg = OmegaConf.create(tree)
        ident = training_identity(cfg)
    except Exception:  # a param set this code cannot read as a config: no group for it
        return None
    if _digest(ident) != logged_hash:
        return None
    return _seed_group(ident)


# the config keys `training_identity` reads (params of other keys cannot change it)
IDENTITY_KEYS = ("agents", "method", "algo", "profile", "train", "rollout", "task", "seed",
                 "timing_repeat", "scale", "engine")


def _logged_value(text: str) -> Any:
    """A param's value as the config held it (MLflow keeps `str(value)`): Python literals
    (numbers, None, booleans, lists) back, anything else the string it is."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def _seed_group(ident: dict[str, Any]) -> str:
    return _digest({"seed_group": {k: v for k, v in ident.items() if k != "seed"}})


def _digest(ident: dict[str, Any]) -> str:
    blob = json.dumps(ident, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
