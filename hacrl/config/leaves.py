"""Every leaf of a job's config has the type its default has: checked before anything else.

The references are the default compositions (`hacrl train` with no overrides, at each scale and
with each engine): a leaf that is a bool, a number, a string, a list or a mapping there must
stay one in the job's config (`true` is not a number; a number where a string is expected is
fine, as in `engine.forward_rows=32` for "auto"; whether a number must be an integer, and its
range, are checked next, by `hacrl.config.ranges`, since group options differ there: one pair's
alpha is 3, another's 1.5). null is always accepted here (the range says where it is not), and
leaves no reference has (`+key=...`) are left to their checks.
A wrong type is one line naming the key, the value and what it must be.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hacrl.core.errors import ConfigError

KINDS = {bool: "true or false", float: "a number", str: "a string",
         list: "a list, e.g. [a,b]", dict: "a mapping, e.g. {k: v}"}


def leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a plain container; lists are leaves."""
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            yield from leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, tree


def kind(value: Any) -> type | None:
    """The type a leaf is checked as (None: null, nothing to check against)."""
    if isinstance(value, bool):
        return bool
    if isinstance(value, int | float):
        return float  # integers and numbers alike (see the module docstring)
    for candidate in (str, list, dict):
        if isinstance(value, candidate):
            return candidate
    return None


def default_kinds(references: list[DictConfig]) -> dict[str, set[type]]:
    """Dotted key -> the kinds of its value in the `references` (default compositions), for
    every leaf that is not null in one of them."""
    out: dict[str, set[type]] = {}
    for reference in references:
        for key, value in leaves(_resolved(reference)):
            if (k := kind(value)) is not None:
                out.setdefault(key, set()).add(k)
    return out


def _resolved(cfg: DictConfig) -> Any:
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as err:  # an interpolation that does not resolve
        raise ConfigError(f"{str(err).splitlines()[0]}; check the key it names") from None


def fits(expected: set[type], value: Any) -> bool:
    got = kind(value)
    return (value is None or got in expected or (dict in expected and value == [])
            or (str in expected and got is float))


def check_leaf_types(cfg: DictConfig, expected: dict[str, set[type]]) -> None:
    """Raise ConfigError for the first leaf whose type is none of `expected`'s for its key
    (`default_kinds` of the default compositions)."""
    # the values as set (an interpolation is checked where its value is set, so the message
    # names the key the user wrote: pair.cross_clip_step, not algo.delta_step)
    written = OmegaConf.to_container(cfg, resolve=False)
    for key, value in leaves(written):
        if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
            continue
        want = expected.get(key)
        if want is not None and not fits(want, value):
            kinds = " or ".join(KINDS[k] for k in (bool, float, str, list, dict) if k in want)
            raise ConfigError(f"{key}={_show(value)}: must be {kinds}")


def _show(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return "null" if value is None else str(value)


__all__ = ["check_leaf_types", "default_kinds", "fits", "kind", "leaves"]
