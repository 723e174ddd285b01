"""Hydra discovers plugins under `hydra_plugins`: this one is hacrl's sweeper (hacrl.sweep)."""
