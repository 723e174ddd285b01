"""Which zoo models share an SFT run, and in what order the runs go to the build workers.

The runs take very different times (half a minute to a minute and a half on one core), and
a process pool hands each next run to the first worker that is free. A poor order leaves
one worker idle while the other finishes a long run, so the order is chosen to make the
workers finish together, from an estimate of each run's cost.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import permutations

from hacrl.zoo.specs import ZOO, ZooSpec, shares_sft

__all__ = ["expected_steps", "finish_time", "group_runs", "run_cost", "schedule"]

# SFT steps each model took to reach its target in the seed-0 build of this zoo version
# (the cards' sft_steps) on the machine the README's timings come from (fresh clones there
# build these weights byte for byte); other CPUs round floats differently and take other
# step counts (qwen3-4b-base: 800-2500; an older machine's table ordered this machine's runs
# ~3% worse). How long SFT takes cannot be read off a spec, and only the order of the runs
# and the progress lines depend on these numbers, never a model.
_STEPS_SEEN: dict[str, int] = {
    "qwen3-1.7b-base": 725,
    "qwen3-4b-base": 800,
    "qwen3-8b-base": 750,
    "qwen3-4b": 950,
    "qwen3-4b-instruct": 1425,
    "llama3.2-1b-instruct": 1400,
    "llama3.2-3b-instruct": 2225,
}
# Mean tokens of a chat-rendered training example: one per character for the qwen family,
# about half that with the llama family's BPE.
_TOKENS_PER_EXAMPLE: dict[str, float] = {"qwen": 55.0, "llama": 25.0}
# Per-token work that does not grow with the width (attention over the sequence, norms,
# loss, framework overhead), in units of hidden size: fitted to one-core step times.
_WIDTH_OFFSET = 32
# Beyond this many runs, try no orders but take the longest first.
_MAX_ORDERS_RUNS = 8


def group_runs(names: Sequence[str]) -> list[list[str]]:
    """``names`` grouped into SFT runs: models that share a trajectory (``shares_sft``)
    go into one run, which trains as long as its furthest target needs; order kept."""
    runs: list[list[str]] = []
    for name in names:
        for run in runs:
            if shares_sft(ZOO[run[0]], ZOO[name]):
                run.append(name)
                break
        else:
            runs.append([name])
    return runs


def expected_steps(name: str) -> int | None:
    """SFT steps model `name` took in the seed-0 build (progress lines); None if unknown."""
    return _STEPS_SEEN.get(name)


def _spec_cost(spec: ZooSpec) -> float:
    steps = _STEPS_SEEN.get(spec.name, spec.max_steps // 2)
    tokens = _TOKENS_PER_EXAMPLE.get(spec.family, max(_TOKENS_PER_EXAMPLE.values()))
    return steps * spec.batch_size * tokens * (spec.hidden_size + _WIDTH_OFFSET) * spec.num_layers


def run_cost(run: Sequence[str]) -> float:
    """Expected cost of one SFT run (arbitrary units, proportional to CPU time)."""
    return max(_spec_cost(ZOO[name]) for name in run)


def finish_time(costs: Sequence[float], workers: int) -> float:
    """When the last of ``costs`` ends if each, in this order, goes to the first free worker."""
    free = [0.0] * max(1, min(workers, len(costs)))
    for cost in costs:
        heapq.heappush(free, heapq.heappop(free) + cost)
    return max(free)


def schedule(
    runs: Sequence[Sequence[str]],
    workers: int,
    cost: dict[int, float] | None = None,
) -> list[list[str]]:
    """``runs`` in the order that finishes first on ``workers`` by ``finish_time``.

    ``cost`` maps a run's index to its cost (default ``run_cost``). Longest first is the
    starting point, and ties keep it: it leaves the short runs to fill the end. With few
    runs every order is tried, since longest first can leave a worker idle for a whole
    short run (costs 3, 3, 2, 2, 2 on two workers: 7 longest first, 6 at best).
    """
    costs = cost if cost is not None else {i: run_cost(r) for i, r in enumerate(runs)}
    lpt = sorted(range(len(runs)), key=lambda i: -costs[i])
    best = lpt
    if 2 <= workers and len(runs) <= _MAX_ORDERS_RUNS:
        best_time = finish_time([costs[i] for i in lpt], workers)
        for order in permutations(lpt):
            t = finish_time([costs[i] for i in order], workers)
            if t < best_time - 1e-9:
                best, best_time = list(order), t
    return [list(runs[i]) for i in best]
