"""HACPO step 1: smoothed capability P over a window of K steps and omega^(k,j) = P_k / P_j."""

import pytest
import torch

from hacrl.algo.capability import CapabilityWindow, omega_matrix, smoothed_capability

# Per-step mean reward of two agents, oldest first (six steps).
HISTORY = [[0.0, 1.0], [0.2, 0.8], [0.4, 0.6], [0.6, 0.4], [0.8, 0.2], [1.0, 0.0]]


def test_smoothed_capability_averages_last_k_steps_including_current():
    p = smoothed_capability(torch.tensor(HISTORY, dtype=torch.float64), window=5)
    # Steps 2..6 (the current one included): (0.2+0.4+0.6+0.8+1.0)/5, (0.8+0.6+0.4+0.2+0.0)/5.
    assert p.tolist() == pytest.approx([0.6, 0.4])


def test_smoothed_capability_with_fewer_steps_than_window_uses_all_steps():
    p = smoothed_capability(torch.tensor(HISTORY[:2], dtype=torch.float64), window=5)
    assert p.tolist() == pytest.approx([0.1, 0.9])


def test_smoothed_capability_window_one_is_current_step_and_floor_applies():
    p = smoothed_capability(torch.tensor(HISTORY, dtype=torch.float64), window=1)
    # Current step: agent 0 = 1.0, agent 1 = 0.0 -> floored to 1e-2 (never 0).
    assert p.tolist() == pytest.approx([1.0, 1e-2])
    p = smoothed_capability(torch.zeros(4, 3), window=5, floor=0.05)
    assert p.tolist() == pytest.approx([0.05] * 3)
    assert bool((p > 0).all())


def test_smoothed_capability_rejects_bad_input():
    with pytest.raises(ValueError, match=r"history must be \[t>=1, n_agents\], got \(0, 2\)"):
        smoothed_capability(torch.zeros(0, 2), window=5)
    with pytest.raises(ValueError, match=r"got \(3,\)"):
        smoothed_capability(torch.zeros(3), window=5)
    with pytest.raises(ValueError, match="capability window K must be >= 1, got 0"):
        smoothed_capability(torch.zeros(3, 2), window=0)


def test_capability_window_tracks_running_k5_mean_and_round_trips():
    win = CapabilityWindow(n_agents=2, window=5)
    expected = []
    for t in range(len(HISTORY)):
        recent = HISTORY[max(0, t - 4): t + 1]
        expected.append([max(sum(r[a] for r in recent) / len(recent), 1e-2) for a in range(2)])
    got = [win.update(torch.tensor(step)).tolist() for step in HISTORY[:4]]
    state = win.state_dict()
    resumed = CapabilityWindow(n_agents=2, window=5)
    resumed.load_state_dict(state)
    for step in HISTORY[4:]:
        a = win.update(torch.tensor(step)).tolist()
        b = resumed.update(torch.tensor(step)).tolist()
        assert a == b
        got.append(a)
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e, abs=1e-6)
    with pytest.raises(ValueError, match=r"expected \[2\] step means, got \(3,\)"):
        win.update(torch.tensor([0.1, 0.2, 0.3]))
    with pytest.raises(ValueError, match="checkpoint has 2 agents, job has 3"):
        CapabilityWindow(n_agents=3, window=5).load_state_dict(state)


@pytest.mark.parametrize("history", [[[0.5]], [[0.5, 0.5, 0.5]], [[0.5, 1.01]], [[-0.01, 0.5]],
                                     [[0.5, "0.5"]], [[0.5, None]]],
                         ids=["short-row", "long-row", "above-1", "below-0", "text", "null"])
def test_a_checkpointed_history_that_is_not_this_teams_is_refused(history) -> None:
    """A loop state from a checkpoint of another team (or edited): rows of n accuracies in
    [0, 1], else ValueError (the job then skips that checkpoint with one warning)."""
    win = CapabilityWindow(n_agents=2, window=5)
    state = {**win.state_dict(), "history": history}
    with pytest.raises(ValueError, match=r"capability history is not rows of 2 accuracies in "
                                         r"\[0, 1\]"):
        win.load_state_dict(state)
    win.load_state_dict({**state, "history": [[0.0, 1.0], [1, 0]]})  # the bounds themselves
    assert win.history == [[0.0, 1.0], [1, 0]]


def test_capability_window_state_is_the_checkpoint_format() -> None:
    """The window's state as a team checkpoint stores it: every key, so a checkpoint written by
    one version is read by the next (renaming a key is a format change, not a refactoring)."""
    win = CapabilityWindow(n_agents=2, window=3, floor=0.05)
    for step in HISTORY[:4]:
        win.update(torch.tensor(step, dtype=torch.float64))
    assert win.state_dict() == {"n_agents": 2, "window": 3, "floor": 0.05,
                                "history": [[0.2, 0.8], [0.4, 0.6], [0.6, 0.4]]}


def test_capability_window_applies_its_own_floor() -> None:
    """The floor the job sets (the authors' code: 1e-8), not the default 1e-2, bounds P."""
    win = CapabilityWindow(n_agents=2, window=5, floor=1e-8)
    p = win.update(torch.tensor([0.5, 0.0]))
    assert p.tolist() == [0.5, pytest.approx(1e-8)]
    assert CapabilityWindow(n_agents=2, window=5, floor=0.2).update(
        torch.tensor([0.5, 0.0])).tolist() == [0.5, pytest.approx(0.2)]


def test_capability_window_averages_in_double_precision() -> None:
    """P is the float64 mean rounded once to float32. Mean rewards of 10 samples (0.7, 0.9,
    ...) are not binary fractions: averaged in float32 this history's second P is one unit in
    the last place off (0.4775000215 instead of 0.4774999917)."""
    history = [[0.1875, 0.7], [0.9, 0.5], [0.875, 0.625], [1 / 3, 0.1875], [0.1875, 0.375]]
    win = CapabilityWindow(n_agents=2, window=5)
    for step in history:
        p = win.update(torch.tensor(step, dtype=torch.float64))
    exact = torch.tensor(history, dtype=torch.float64).mean(dim=0).to(torch.float32)
    assert p.dtype == torch.float32
    assert torch.equal(p, exact)


def test_omega_matrix_is_ratio_of_target_to_source_capability():
    p = torch.tensor([0.6, 0.2, 0.3], dtype=torch.float64)
    omega = omega_matrix(p)
    expected = [[1.0, 3.0, 2.0], [1 / 3, 1.0, 2 / 3], [0.5, 1.5, 1.0]]
    for k in range(3):
        assert omega[k].tolist() == pytest.approx(expected[k])
    # omega^(k,j) * omega^(j,k) = 1 without clamp.
    assert torch.allclose(omega * omega.T, torch.ones(3, 3, dtype=torch.float64))


def test_omega_matrix_clamp():
    p = torch.tensor([0.9, 0.01, 0.5], dtype=torch.float64)
    raw = omega_matrix(p)
    assert raw[0, 1].item() == pytest.approx(90.0)
    assert raw[1, 0].item() == pytest.approx(1 / 90)
    clamped = omega_matrix(p, clamp=(0.1, 10.0))
    expected = [[1.0, 10.0, 1.8], [0.1, 1.0, 0.1], [5 / 9, 10.0, 1.0]]
    for k in range(3):
        assert clamped[k].tolist() == pytest.approx(expected[k])


def test_floored_zero_capability_keeps_omega_finite():
    p = smoothed_capability(torch.tensor([[0.0, 0.5], [0.0, 0.7]]), window=5)
    omega = omega_matrix(p)
    assert torch.isfinite(omega).all()
    assert omega[1, 0].item() == pytest.approx(0.6 / 1e-2, rel=1e-5)
