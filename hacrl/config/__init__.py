"""A job's config: composed from the config tree, checked leaf by leaf, turned into a `JobSpec`.

composition.py  `compose(overrides)` through Hydra; every leaf's default kind
leaves.py       every leaf's type (checked before anything else)
ranges.py       every leaf's range (`RANGES`)
identity.py     the training identity and its hash (a sweep cell's id)
settings.py     a method's loop and loss settings, built once from the config
protocol.py     an evaluation protocol (tokens, greedy or k samples), hashed
validation.py   `validate(cfg) -> JobSpec`, or one `ConfigError` naming the key
"""

from hacrl.config.composition import (
    CONFIG_DIR,
    compose,
    default_kinds,
    literal_config,
    use_default_kinds,
)
from hacrl.config.identity import (
    CROSS_AGENT_KEYS,
    OLD_LOGPROBS,
    config_hash,
    seed_group,
    seed_group_of_logged,
    training_identity,
    zoo_seed,
)
from hacrl.config.validation import (
    AgentSpec,
    ConfigError,
    JobSpec,
    check_zoo_draw,
    model_path,
    validate,
)

__all__ = ["CONFIG_DIR", "CROSS_AGENT_KEYS", "OLD_LOGPROBS", "AgentSpec", "ConfigError", "JobSpec",
           "check_zoo_draw", "compose", "config_hash", "default_kinds", "literal_config",
           "model_path", "seed_group", "seed_group_of_logged", "training_identity",
           "use_default_kinds", "validate", "zoo_seed"]
