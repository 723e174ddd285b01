"""`hacrl bench step`: the cost of one HACPO step against one GSPOx2 step, phase by phase.

GSPOx2 gives each agent 2G rollouts and trains on them; HACPO gives each agent G rollouts and
trains on its own G plus the G it borrows. R is what scales with the samples an agent draws
(sampling, verifying, the old/reference log-probs of its own samples: a borrowed sample's source
log-probs are its source's own), T the updates on 2G rows; the ideal cost ratio is
(R + T) / (2R + T). Both methods run side by side in this process, alternating, on the same
pair; the ratio of medians is printed next to the ideal computed from the measured R and T.
On the local engine each method's phases are also printed next to their compute floor (the
step's own shapes replayed as bare model calls, as `hacrl bench floor` does) and the ratio.
"""

from __future__ import annotations

import statistics

import torch

from hacrl.bench.compute_floor import STEP_PHASES as PHASES
from hacrl.bench.compute_floor import (
    FloorMeter,
    close,
    phase_seconds,
    print_floor_table,
    team_loops,
)
from hacrl.config import ConfigError, JobSpec, compose, validate
from hacrl.core.errors import print_error
from hacrl.training.loop import seed_everything


def local_twin(overrides: list[str]) -> list[str]:
    """The same cell on the local engine: the overrides without engine keys, engine=local."""
    return [o for o in overrides if not o.lstrip("+~").startswith("engine")] + ["engine=local"]


Samples = dict[tuple[str, str], list[dict[str, float]]]  # (method, engine|local) -> per step


def step_cost(overrides: list[str], repeats: int = 3) -> int:
    """Print one step's phases for gspo_x2 and hacpo; for an engine other than local, also the
    same cell on the local engine, measured side by side, and the ratio engine / local."""
    try:
        specs = _specs(overrides)
    except ConfigError as err:
        print_error(err, "hacrl: config error: ")
        return 2
    hacpo = specs["hacpo", "engine"]
    engine = str(hacpo.cfg.engine.name)
    samples, floors = _measure(specs, engine, repeats)
    _print_methods(samples, hacpo, engine, repeats)
    _print_floors(samples, floors, engine, repeats)
    if engine != "local":
        _print_engine_overhead(samples, engine, repeats)
    return 0


def _specs(overrides: list[str]) -> dict[tuple[str, str], JobSpec]:
    """(method, "engine") for gspo_x2 and hacpo; for an engine other than local, also
    (method, "local"), the same cells on the local engine. Raises ConfigError."""
    base = ["validation.every=0", "eval.at_end=false", *overrides]
    specs = {("gspo_x2", "engine"): validate(compose(["method=gspo_x2", *base])),
             ("hacpo", "engine"): validate(compose(["method=hacpo", *base]))}
    engine = str(specs["hacpo", "engine"].cfg.engine.name)
    if engine != "local":
        for method in ("gspo_x2", "hacpo"):
            specs[method, "local"] = validate(compose([f"method={method}", *local_twin(base)]))
    return specs


def _measure(specs: dict[tuple[str, str], JobSpec], engine: str,
             repeats: int) -> tuple[Samples, Samples]:
    """Each spec's phase seconds of steps 2 .. repeats + 1, the specs stepped in turn; on the
    local engine also each step's compute floor (compute_floor), measured right after it."""
    hacpo = specs["hacpo", "engine"]
    if hacpo.cfg.engine.get("threads"):
        torch.set_num_threads(int(hacpo.cfg.engine.threads))
    seed_everything(int(hacpo.cfg.seed))
    cluster = None
    if engine == "verl":  # all teams' workers at once in one Ray cluster: room for each of them
        from hacrl.engines.verl.job_cluster import VerlCluster

        engines = sum(len(spec.agents) for (_, which), spec in specs.items() if which == "engine")
        cluster = VerlCluster.get(hacpo.cfg, engines)
    runs = {key: team_loops(spec, record=engine == "local") for key, spec in specs.items()}
    samples: Samples = {key: [] for key in runs}
    floors: Samples = {key: [] for key in runs}
    try:
        meters = {key: FloorMeter(recorded) for key, (_, recorded) in runs.items() if recorded}
        for step in range(1, repeats + 2):  # step 1 warms up and is dropped
            for key, (loops, _) in runs.items():  # alternating: noise hits all alike
                meter = meters.get(key)
                seconds, floor = meter.step(loops, step) if meter else (
                    phase_seconds(loops, step), None)
                if step > 1:
                    samples[key].append(seconds)
                    floors[key] += [floor] if floor is not None else []
    finally:
        for loops, _ in runs.values():
            close(loops)
        if cluster is not None:
            cluster.release()
    return samples, floors


def _median(samples: Samples, method: str, phase: str | None = None,
            which: str = "engine") -> float:
    """Median seconds of one phase (None: the whole step) of `method` on the engine or local."""
    return statistics.median(sum(s.values()) if phase is None else s[phase]
                             for s in samples[method, which])


def _print_methods(samples: Samples, hacpo: JobSpec, engine: str, repeats: int) -> None:
    """The phase table of gspo_x2 and hacpo, R and T, and the cost ratio against its ideal."""
    def median(method: str, phase: str | None = None) -> float:
        return _median(samples, method, phase)

    agents = ", ".join(a.name for a in hacpo.agents)
    device = f", device={hacpo.cfg.engine.device}" if engine != "local" else ""
    print(f"one step on {agents} (scale={hacpo.cfg.scale.name}, engine={engine}{device}, "
          f"median of {repeats}), seconds:")
    print(f"{'phase':<10}{'gspo_x2':>10}{'hacpo':>10}")
    for phase in PHASES:
        print(f"{phase:<10}{median('gspo_x2', phase):>10.3f}{median('hacpo', phase):>10.3f}")
    total_x2, total_hacpo = median("gspo_x2"), median("hacpo")
    print(f"{'total':<10}{total_x2:>10.3f}{total_hacpo:>10.3f}")
    rollout = (total_x2 - median("gspo_x2", "update")) / 2  # R: per G samples drawn
    training = median("gspo_x2", "update")  # T: updates on 2G rows
    ideal = (rollout + training) / (2 * rollout + training)
    ratio = total_hacpo / total_x2
    print(f"R (draw + verify + log-probs of G samples) = {rollout:.3f} s, "
          f"T (updates on 2G rows) = {training:.3f} s, "
          f"R/T = {rollout / training:.2f}")
    print(f"hacpo / gspo_x2 = {ratio:.3f}   ideal (R+T)/(2R+T) = {ideal:.3f}   "
          f"off by {100 * (ratio / ideal - 1):+.1f}%   (paper wall-clock: 0.82)")


def _print_floors(samples: Samples, floors: Samples, engine: str, repeats: int) -> None:
    """Each method's phases next to their compute floor (local engine only)."""
    if engine != "local":
        print(f"\ncompute floor: not measured on engine={engine} (its models live in its workers, "
              "not in this process; `hacrl bench floor` measures the floor on engine=local)")
        return
    print(f"\ncompute floor: the step's own shapes as bare model calls (median of {repeats}), "
          "seconds, and real / floor:")
    print_floor_table({method: (samples[method, "engine"], floors[method, "engine"])
                       for method in ("gspo_x2", "hacpo")})


def _print_engine_overhead(samples: Samples, engine: str, repeats: int) -> None:
    """Each phase on `engine` against the same cell on the local engine, and their ratio."""
    print(f"\nengine overhead: the same cell on engine=local in this run, seconds "
          f"(median of {repeats}), and {engine} / local:")
    print(f"{'phase':<10}{'method':>9}{'local':>10}{engine:>10}{'ratio':>9}")
    for method in ("gspo_x2", "hacpo"):
        for row in (*PHASES, None):
            ours, theirs = _median(samples, method, row, "local"), _median(samples, method, row)
            name = row or "total"
            print(f"{name:<10}{method:>9}{ours:>10.3f}{theirs:>10.3f}"
                  f"{theirs / max(ours, 1e-9):>9.2f}")
