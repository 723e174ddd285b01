"""Capability estimation (HACPO step 1).

P_t^(k) is agent k's mean verifier reward at step t, smoothed over the last K steps
(the current one included). omega_t^(k,j) = P_t^(k) / P_t^(j) compares two agents.
"""

from __future__ import annotations

import torch
from torch import Tensor


def smoothed_capability(history: Tensor, window: int, floor: float = 1e-2) -> Tensor:
    """P^(k): mean of the last `window` per-step mean rewards, floored so it is never 0.

    As the code behind the paper's numbers does it (the authors' `main`): the window's mean is
    raised to `floor`, 1e-8 there (profile `as_run`), and omega is clamped to [0.1, 10]
    afterwards; the paper states no floor (profile `bare`: 0.01). (Their `verl-v1` port also
    floors each step's value before the mean: docs/FIDELITY.md.)

    Args:
        history: [t, n_agents] per-step mean reward of each agent, oldest first (t >= 1).
        window: K, the number of most recent steps averaged (paper: K = 5).
        floor: lower bound on P so that omega = P_k / P_j stays finite when an agent scores 0.

    Returns:
        [n_agents] smoothed capability P.
    """
    if history.ndim != 2 or history.shape[0] == 0:
        raise ValueError(f"history must be [t>=1, n_agents], got {tuple(history.shape)}")
    if window < 1:
        raise ValueError(f"capability window K must be >= 1, got {window}")
    return history[-window:].mean(dim=0).clamp_min(floor)


def omega_matrix(capability: Tensor, clamp: tuple[float, float] | None = None) -> Tensor:
    """omega^(k,j) = P^(k) / P^(j) for every ordered pair of agents.

    Args:
        capability: [n_agents] P, strictly positive (see `smoothed_capability`).
        clamp: optional (low, high) bounds on omega (the code behind the paper's numbers uses
            (0.1, 10); the paper's objective has none).

    Returns:
        [n_agents, n_agents] omega with omega[k, j] = P_k / P_j (diagonal 1).
    """
    omega = capability[:, None] / capability[None, :]
    if clamp is not None:
        omega = omega.clamp(min=clamp[0], max=clamp[1])
    return omega


class CapabilityWindow:
    """Keeps the per-step reward history needed for P; the only stateful piece of the core.

    Its state goes into checkpoints so a resumed job sees the same P as an uninterrupted one.
    """

    def __init__(self, n_agents: int, window: int, floor: float = 1e-2) -> None:
        self.n_agents = n_agents
        self.window = window
        self.floor = floor
        self.history: list[list[float]] = []

    def update(self, step_means: Tensor) -> Tensor:
        """Append this step's [n_agents] mean rewards; return the smoothed [n_agents] P."""
        if step_means.shape != (self.n_agents,):
            raise ValueError(f"expected [{self.n_agents}] step means, got {tuple(step_means.shape)}")
        self.history.append([float(v) for v in step_means])
        self.history = self.history[-self.window :]
        return smoothed_capability(torch.tensor(self.history, dtype=torch.float64), self.window,
                                   self.floor).to(torch.float32)

    def state_dict(self) -> dict:
        return {"n_agents": self.n_agents, "window": self.window, "floor": self.floor,
                "history": [list(row) for row in self.history]}

    def load_state_dict(self, state: dict) -> None:
        if state["n_agents"] != self.n_agents:
            raise ValueError(f"checkpoint has {state['n_agents']} agents, job has {self.n_agents}")
        rows = [list(row) for row in state["history"]]
        if not all(len(row) == self.n_agents and all(
                isinstance(p, int | float) and 0.0 <= p <= 1.0 for p in row) for row in rows):
            raise ValueError(f"capability history is not rows of {self.n_agents} accuracies in "
                             "[0, 1]")
        self.history = rows[-self.window :]
