"""Benchmarks of one training step: `hacrl bench step` (HACPO vs GSPOx2, phase by phase:
`step`) and `hacrl bench floor` (each phase next to its compute floor: `compute_floor`)."""

from hacrl.bench.step import step_cost

__all__ = ["step_cost"]
