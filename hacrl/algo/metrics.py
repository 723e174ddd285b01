"""How a metric is combined: over micro-batches (and ranks) into a mini-batch, and over a
step's updates. Whoever produces a metric declares its kind next to it (`policy_loss`'s own
metrics in `hacrl.algo.loss.LOSS_METRICS`, a borrowed objective's in `register_borrowed`);
engines and the loop only read the declaration, so a new metric needs no second list.

Kinds:
    SHARE     a micro-batch's exact share of the mini-batch's value (computed with the mini-batch's
              `Denominators`): added over micro-batches and ranks; mean over a step's updates.
    ROW_MEAN  a mean over the rows it was computed on: row-weighted over micro-batches and
              ranks; mean over a step's updates.
    MIN, MAX  extremes everywhere.
    SUM, COUNT  totals added over micro-batches and ranks; over a step, `<name>_sum` with its
              `<name>_count` becomes `<name>_mean` (their ratio, over all rows of all updates);
              a COUNT is not reported itself, an unpaired SUM is averaged over the updates.

A metric nobody declared (grad_norm, an engine's own) is read by its name: `*_min`, `*_max`,
`*_sum`, `*_count` as above, anything else a mean.
"""

from __future__ import annotations

from collections.abc import Mapping

SHARE, ROW_MEAN, MIN, MAX, SUM, COUNT = "share", "row_mean", "min", "max", "sum", "count"
KINDS = (SHARE, ROW_MEAN, MIN, MAX, SUM, COUNT)
_SUFFIXES = {"_min": MIN, "_max": MAX, "_sum": SUM, "_count": COUNT}


def kind_of(name: str, kinds: Mapping[str, str] | None = None) -> str:
    """The declared kind of metric `name`, else the one its name implies (ROW_MEAN: a mean)."""
    if kinds and name in kinds:
        return kinds[name]
    for suffix, kind in _SUFFIXES.items():
        if name.endswith(suffix):
            return kind
    return ROW_MEAN


def check_kinds(kinds: Mapping[str, str]) -> None:
    """Raise ValueError for a kind that is not one of KINDS."""
    bad = {name: kind for name, kind in kinds.items() if kind not in KINDS}
    if bad:
        raise ValueError(f"unknown metric kind(s) {bad}; use one of: {', '.join(KINDS)}")


def add_micro_batch(totals: dict[str, float], metrics: Mapping[str, float],
                    kinds: Mapping[str, str], rows: int, batch_rows: int) -> None:
    """Fold one micro-batch's metrics (`rows` of the mini-batch's `batch_rows`) into `totals`."""
    for key, value in metrics.items():
        kind = kind_of(key, kinds)
        if kind == MIN:
            totals[key] = min(totals.get(key, value), value)
        elif kind == MAX:
            totals[key] = max(totals.get(key, value), value)
        else:
            part = value * rows / batch_rows if kind == ROW_MEAN else value
            totals[key] = totals.get(key, 0.0) + part


def combine_updates(per_update: list[dict[str, float]],
                    kinds: Mapping[str, str] | None = None) -> dict[str, float]:
    """One step's metrics from its updates' metrics (see the kinds above): a key's mean over the
    updates that report it; extremes for MIN/MAX; `<name>_sum` / `<name>_count` -> `<name>_mean`."""
    values: dict[str, list[float]] = {}
    for metrics in per_update:
        for key, value in metrics.items():
            values.setdefault(key, []).append(value)
    out: dict[str, float] = {}
    for key, seen in values.items():
        kind = kind_of(key, kinds)
        base = key[:-4] if key.endswith("_sum") else key
        if kind == COUNT:
            continue
        if kind == SUM and f"{base}_count" in values:
            count = sum(values[f"{base}_count"])
            if count > 0:
                out[f"{base}_mean"] = sum(seen) / count
        elif kind == MIN:
            out[key] = min(seen)
        elif kind == MAX:
            out[key] = max(seen)
        else:
            out[key] = sum(seen) / len(seen)
    return out


__all__ = ["COUNT", "KINDS", "MAX", "MIN", "ROW_MEAN", "SHARE", "SUM", "add_micro_batch",
           "check_kinds", "combine_updates", "kind_of"]
