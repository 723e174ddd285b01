"""The registries a method is assembled from, keyed by name, like verl's `register_adv_est`
(the entries, and the method registry that names them, are in `hacrl.algo.methods`):

- advantage estimators (`register_advantage`): rewards [n, P, G] -> A [n_target, n_source, P, G];
- borrowed-sample objectives (`register_borrowed`): how a partner's samples enter a target's
  loss (not at all, as the target's own samples, or through a cross-agent term of their own).

A `MethodSpec` names one of each by string; names are resolved when a config is validated
(`hacrl.config` turns the KeyError of `get_advantage` / `get_borrowed` into a one-line
ConfigError naming the choices), so registration order does not matter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from torch import Tensor

from hacrl.algo.loss_inputs import LossBatch, LossConfig
from hacrl.algo.metrics import check_kinds

# -- advantage estimators ---------------------------------------------------------------------

@dataclass(frozen=True)
class AdvantageOptions:
    """The config's numbers an estimator may use (see `capability_aware_advantages`)."""

    omega_clamp: tuple[float, float] | None = None
    baseline_guard: bool = False
    zero_uniform_groups: bool = False


# (rewards [n_agents, P, G], capability P [n_agents], options) -> A [n_target, n_source, P, G]
AdvantageFn = Callable[[Tensor, Tensor, AdvantageOptions], Tensor]


@dataclass(frozen=True)
class AdvantageEstimator:
    name: str
    fn: AdvantageFn
    min_group: int = 1  # fewest rollouts per prompt it is defined for (group-relative: 2)


ADVANTAGES: dict[str, AdvantageEstimator] = {}


def register_advantage(name: str, *, min_group: int = 1) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register an advantage estimator under `name`."""
    def add(fn: AdvantageFn) -> AdvantageFn:
        _new(ADVANTAGES, name, "advantage estimator")
        ADVANTAGES[name] = AdvantageEstimator(name, fn, min_group)
        return fn
    return add


def get_advantage(name: str) -> AdvantageEstimator:
    return _get(ADVANTAGES, name, "advantage estimator")


# -- borrowed-sample objectives ---------------------------------------------------------------

class BorrowedTerm(NamedTuple):
    """What a cross-agent objective computes for every row of a (micro-)batch; the loss uses
    the rows flagged `cross`. loss: [B]; outside: [B] bool, rows its clip cut off; metrics: over
    the cross rows, each declared (with its kind) in `register_borrowed(metrics=...)`."""

    loss: Tensor
    outside: Tensor
    metrics: dict[str, float] = {}  # noqa: RUF012 (NamedTuple default, never mutated)


# (s [B] sequence ratios, rows, loss config, lower_m of this update) -> BorrowedTerm
BorrowedTermFn = Callable[[Tensor, "LossBatch", "LossConfig", float], BorrowedTerm]


@dataclass(frozen=True)
class BorrowedObjective:
    """How a partner's samples enter a target's loss.

    partners: the partners' samples become rows of the target (re-encoded in its tokens).
    term: their loss (rows flagged `cross`: ratio against the source's rollout policy); None
        scores them as the target's own samples (old log-probs: the target's own, taken before
        any update; the own-sample objective and clip).
    metrics: kinds of the extra metrics `term` reports (`hacrl.algo.metrics`).
    """

    name: str
    term: BorrowedTermFn | None
    partners: bool = True
    metrics: Mapping[str, str] = field(default_factory=dict)

    @property
    def as_own(self) -> bool:
        """Partners' rows are scored as own rows (they need the target's own log-probs)."""
        return self.partners and self.term is None


BORROWED: dict[str, BorrowedObjective] = {}


def register_borrowed(name: str, *, partners: bool = True, metrics: Mapping[str, str] | None = None,
                      ) -> Callable[[BorrowedTermFn | None], BorrowedTermFn | None]:
    """Decorator: register a borrowed-sample objective whose cross-agent term is the decorated
    function (`register_borrowed(name)(None)` registers one without a term)."""
    check_kinds(metrics or {})

    def add(term: BorrowedTermFn | None) -> BorrowedTermFn | None:
        _new(BORROWED, name, "borrowed-sample objective")
        if term is not None and not partners:
            raise ValueError(f"borrowed objective {name!r}: a term needs partners=True")
        BORROWED[name] = BorrowedObjective(name, term, partners, dict(metrics or {}))
        return term
    return add


def get_borrowed(name: str) -> BorrowedObjective:
    return _get(BORROWED, name, "borrowed-sample objective")


_T = TypeVar("_T")


def _new(registry: Mapping[str, object], name: str, what: str) -> None:
    if name in registry:
        raise ValueError(f"{what} {name!r} is already registered")


def _get(registry: Mapping[str, _T], name: str, what: str) -> _T:
    try:
        return registry[name]
    except KeyError:
        raise KeyError(f"unknown {what} {name!r}; registered: {', '.join(sorted(registry))}") from None
