"""The core's small plumbing, value by value: how micro-batch metrics fold into a mini-batch's,
how a mini-batch's token columns are trimmed, and whose samples each method trains on. A slip
here changes logged numbers or trained rows without failing any equation test."""

from __future__ import annotations

import pytest
import torch

from hacrl.algo import get_method
from hacrl.algo.loss_inputs import LossBatch
from hacrl.algo.metrics import MAX, MIN, ROW_MEAN, SHARE, SUM, add_micro_batch


def test_micro_batches_fold_by_kind() -> None:
    """Two micro-batches of 3 and 1 rows (of a 4-row mini-batch): a share adds, a row mean is
    row-weighted, extremes stay extremes, a sum adds; an undeclared name is read by its suffix."""
    kinds = {"share": SHARE, "mean": ROW_MEAN, "low": MIN, "high": MAX, "total": SUM}
    totals: dict[str, float] = {}
    add_micro_batch(totals, {"share": 0.25, "mean": 2.0, "low": 5.0, "high": 5.0, "total": 3.0,
                             "ratio_min": 0.9, "ratio_max": 1.1, "clipped": 0.5},
                    kinds, rows=3, batch_rows=4)
    add_micro_batch(totals, {"share": 0.5, "mean": 6.0, "low": 1.0, "high": 9.0, "total": 4.0,
                             "ratio_min": 0.7, "ratio_max": 1.3, "clipped": 1.0},
                    kinds, rows=1, batch_rows=4)
    assert totals == {"share": 0.75, "mean": 2.0 * 3 / 4 + 6.0 * 1 / 4, "low": 1.0, "high": 9.0,
                      "total": 7.0, "ratio_min": 0.7, "ratio_max": 1.3,
                      "clipped": 0.5 * 3 / 4 + 1.0 / 4}


def test_micro_batch_extremes_are_kept_in_either_order() -> None:
    """The first value seeds an extreme (not 0): a minimum above 0 and a maximum below 0."""
    totals: dict[str, float] = {}
    for value in (4.0, 2.0, 3.0):
        add_micro_batch(totals, {"x_min": value, "y_max": -value}, {}, rows=1, batch_rows=3)
    assert totals == {"x_min": 2.0, "y_max": -2.0}


def _batch(width: int, ref: bool) -> LossBatch:
    rows = 3
    return LossBatch(response_mask=torch.ones(rows, width),
                     old_logp=torch.arange(rows * width, dtype=torch.float32).view(rows, width),
                     source_mean_logp=torch.tensor([-1.0, -2.0, -3.0]),
                     advantages=torch.tensor([0.5, -0.5, 1.0]), omega=torch.tensor([1.0, 2.0, 0.5]),
                     cross=torch.tensor([False, True, True]), own=torch.tensor([True, False, False]),
                     ref_logp=torch.full((rows, width), -0.1) if ref else None)


@pytest.mark.parametrize("ref", [False, True])
def test_trim_cuts_every_token_column_and_keeps_row_fields(ref: bool) -> None:
    batch = _batch(width=6, ref=ref)
    trimmed = batch.trim(4)
    assert trimmed.response_mask.shape == (3, 4) and trimmed.old_logp.shape == (3, 4)
    assert torch.equal(trimmed.old_logp, batch.old_logp[:, :4])
    if ref:
        assert trimmed.ref_logp is not None and trimmed.ref_logp.shape == (3, 4)
    else:
        assert trimmed.ref_logp is None
    for name in ("source_mean_logp", "advantages", "omega", "cross", "own"):
        assert torch.equal(getattr(trimmed, name), getattr(batch, name)), name


@pytest.mark.parametrize(("method", "team", "sources"), [
    ("hacpo", 2, 2), ("hacpo", 3, 3), ("hacpo_no_omega", 3, 3), ("naive", 2, 2),
    ("gspo", 2, 1), ("grpo", 3, 1), ("gspo_x2", 2, 1)])
def test_row_sources_count_whose_samples_a_target_trains_on(method: str, team: int,
                                                            sources: int) -> None:
    """HACPO and Naive train each agent on every team member's samples, the single-agent
    baselines on their own only."""
    assert get_method(method).row_sources(team) == sources
