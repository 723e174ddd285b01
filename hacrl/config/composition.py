"""Composing a job's config from the config tree.

`compose(overrides)` builds the config from the config tree (`hacrl/conf/`, which the
repository's `experiments/` and `sweeps/` link to; it ships inside the package, so a wheel
install has it too) with Hydra's compose API. `default_kinds` is every leaf's kind in the
default compositions (the types `validate` checks against); `literal_config` makes a config of a
resolved tree without reading its texts as interpolations again.
"""

from __future__ import annotations

import re
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hacrl.core.errors import ConfigError


def _config_dir() -> Path:
    from importlib.resources import files

    return Path(str(files("hacrl") / "conf")).resolve()


CONFIG_DIR = _config_dir()


def compose(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The job config for these Hydra overrides (no output directory, no logging files)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    # inside the running Hydra app (a job validating itself) its config loader is already set up
    running = GlobalHydra.instance().is_initialized()
    try:
        with nullcontext() if running else initialize_config_dir(
                config_dir=str(CONFIG_DIR), version_base="1.3"):
            return hydra_compose(config_name="train", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        # Hydra's whole message on one line (its hints included: "To append to your config
        # use +key=value", "Did you mean ..."), less OmegaConf's full_key/object_type notes
        lines = [line.strip() for line in str(err).splitlines() if line.strip()
                 and not line.strip().startswith(("full_key:", "object_type=", "reference_type="))]
        first = "; ".join(lines) if lines else type(err).__name__
        missing = re.search(r"Could not find '([\w/]+)/([^']+)'", first)
        if missing and (CONFIG_DIR / missing.group(1)).is_dir():
            group, option = missing.groups()
            options = sorted(f.stem for f in (CONFIG_DIR / group).glob("*.yaml"))
            raise ConfigError(f"{group}={option}: no such option; choose one of: "
                              f"{', '.join(options)}") from None
        raise ConfigError(f"{first} (check the override's spelling; groups and their options "
                          f"are the folders and files of {CONFIG_DIR})") from None
    except TypeError as err:  # Hydra itself fails on a list or mapping given to a group
        groups = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir())
        raise ConfigError(f"{', '.join(overrides)}: not a config Hydra can compose ({err}); a "
                          f"config group ({', '.join(groups)}) takes one option name") from None


_KINDS: dict[str, set[type]] | None = None


def default_kinds() -> dict[str, set[type]]:
    """The kinds of every leaf of the default compositions (`hacrl.config.leaves`): tiny and
    paper scale, each engine; composed once per process (~0.4 s), or handed over by the
    process that forked this one (`use_default_kinds`: a warm sweep cell gets its sweep's)."""
    global _KINDS
    if _KINDS is None:
        from hacrl.config.leaves import default_kinds as kinds_of

        _KINDS = kinds_of([compose([]), compose(["scale=paper"]), compose(["engine=verl"])])
    return _KINDS


def use_default_kinds(kinds: dict[str, set[type]]) -> None:
    """Take `default_kinds` as computed by another process of the same code and configs."""
    global _KINDS
    _KINDS = kinds


def literal_config(tree: Any) -> DictConfig:
    """A config of the resolved container `tree` whose texts stay as they are: a `${...}` in a
    value (an escaped `\\${...}` on the command line, kept literal by Hydra) is escaped again,
    or the new config would read it as an interpolation and resolve it after all."""
    def escape(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: escape(v) for k, v in value.items()}
        if isinstance(value, list):
            return [escape(v) for v in value]
        if isinstance(value, str) and "${" in value:  # backslashes before it are doubled
            return re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", value)
        return value

    made = OmegaConf.create(escape(tree))
    assert isinstance(made, DictConfig)
    return made
