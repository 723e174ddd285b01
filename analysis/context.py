"""What every table and figure builder reads: the store, the sweep's cells, the scale, the pairs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from analysis.cell_values import Value, find, run_value
from analysis.store import Store
from hacrl.config import CONFIG_DIR
from hacrl.sweep.grid import SWEEP_DIR as _SWEEPS
from hacrl.sweep.grid import Cell, load_grids


@dataclass(frozen=True)
class Pair:
    key: str            # the config option, e.g. "size"
    name: str           # e.g. "qwen3-1.7b-base+qwen3-4b-base" (the paper CSVs' `pair`)
    setting: str
    agents: tuple[str, ...]


def pair(key: str) -> Pair:
    node = OmegaConf.load(CONFIG_DIR / "pair" / f"{key}.yaml")
    return Pair(key, str(node.name), str(node.setting), tuple(str(a) for a in node.agents))


@dataclass
class Context:
    store: Store
    cells: list[Cell]
    scale: str
    sweep_dirs: tuple[Any, ...] = (_SWEEPS,)

    @property
    def scale_note(self) -> str:
        return (f"{self.scale} scale" if self.scale == "paper" else
                f"{self.scale} scale (the project's tiny models: not comparable to the paper's "
                "numbers in absolute terms)")

    def benchmark_metric(self, protocol: str, benchmark: str, name: str = "acc") -> str:
        """eval/<protocol>/<benchmark as logged at this scale>/<name>."""
        logged = benchmark if self.scale == "paper" else f"tiny_{benchmark}"
        return f"eval/{protocol}/{logged}/{name}"

    @cached_property
    def grids(self) -> dict[str, list[dict[str, Any]]]:
        """sweep name -> its own grids, for every sweep file of the sweep folders."""
        out: dict[str, list[dict[str, Any]]] = {}
        names = {p.stem for folder in self.sweep_dirs for p in Path(folder).glob("*.yaml")}
        for name in sorted(names):
            for sweep, grid in load_grids(name, self.sweep_dirs):
                if grid not in out.setdefault(sweep, []):
                    out[sweep].append(grid)
        return out

    def grids_of(self, sweep: str) -> set[str]:
        """The sweeps whose grids `sweep` runs (itself, and what it includes)."""
        return {name for name, _ in load_grids(sweep, self.sweep_dirs)}

    def grid(self, sweep: str) -> dict[str, Any]:
        grids = self.grids.get(sweep) or [{}]
        return grids[0]

    def pairs_of(self, sweep: str) -> list[Pair]:
        keys = self.grid(sweep).get("pair", [])
        return [pair(str(k)) for k in (keys if isinstance(keys, list) else [keys])]

    def protocol_of(self, sweep: str) -> str:
        return str((self.grid(sweep).get("protocol") or ["main"])[0])

    def value(self, method: str, p: Pair, agent: str, metric: str, sweep: str | None,
              **params: Any) -> Value:
        """`metric` of `agent` under `method` in pair `p` (single-agent methods: the agent's own
        cell, which every pair it is in shares), over all matching cells (e.g. seeds)."""
        from hacrl.algo.methods import METHODS

        team = list(p.agents) if METHODS[method].shares_rollouts else [agent]
        cells = find(self.cells, method, team, sweep, **params)
        if not cells:
            return Value(reason="not in this sweep")
        return Value.combine([run_value(self.store, c, agent, metric) for c in cells])
