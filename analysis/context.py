"""What every table and figure builder reads: the store, the sweep's cells, the scale, the pairs,
the methods' facts and the sweeps' grids (the axes a table is laid out by). All of it comes from
the sweep manifest's record (`hacrl.schema.sweep_manifest`) and the store, never from the
sweep's code, the config tree or the method registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from analysis.cell_values import Value, find, run_value
from analysis.store import Store
from hacrl.schema import metric_names as M
from hacrl.schema.sweep_manifest import CellRecord, MethodRecord, PairRecord


@dataclass(frozen=True)
class Pair:
    key: str            # the config option, e.g. "size"
    name: str           # e.g. "qwen3-1.7b-base+qwen3-4b-base" (the paper CSVs' `pair`)
    setting: str
    agents: tuple[str, ...]

    @classmethod
    def of(cls, key: str, record: PairRecord) -> Pair:
        """The pair a manifest's `pairs[key]` records."""
        return cls(key, record.name, record.setting, tuple(record.agents))


@dataclass
class Context:
    store: Store
    cells: list[CellRecord]
    scale: str
    # sweep name -> its own grids, for every sweep file (the manifest's `grids`)
    grids: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # pair option -> who trains together, method -> its facts (the manifest's `pairs`, `methods`)
    pairs: dict[str, PairRecord] = field(default_factory=dict)
    methods: dict[str, MethodRecord] = field(default_factory=dict)
    # the runs' per-problem outcomes, read once per report (`analysis.evidence.evidence_of`)
    evidence: Any = field(default=None, repr=False)

    @property
    def scale_note(self) -> str:
        if self.scale == "paper":
            return f"{self.scale} scale"
        draws = sorted({c.zoo_seed for c in self.cells})
        zoo = "the project's tiny models" if draws in ([], [0]) else \
            f"the project's tiny models, zoo draw {', '.join(map(str, draws))}"
        return (f"{self.scale} scale ({zoo}: not comparable to the paper's numbers in absolute "
                "terms)")

    def logged_benchmark(self, benchmark: str) -> str:
        """A paper benchmark's name as this scale logs it (`math500` -> `tiny_math500`)."""
        return benchmark if self.scale == "paper" else f"tiny_{benchmark}"

    def benchmark_metric(self, protocol: str, benchmark: str, name: str = "acc") -> str:
        """eval/<protocol>/<benchmark as logged at this scale>/<name>."""
        return M.eval_metric(protocol, self.logged_benchmark(benchmark), name)

    def grid(self, sweep: str) -> dict[str, Any]:
        """The sweep's axes, its grids merged: each key's values in the order they first
        appear (Table 1 lists base in one grid and the trained methods, over seeds, in another)."""
        merged: dict[str, Any] = {}
        for grid in self.grids.get(sweep) or [{}]:
            for key, values in grid.items():
                values = values if isinstance(values, list) else [values]
                have = merged.setdefault(key, [])
                have += [v for v in values if v not in have]
        return merged

    def pairs_of(self, sweep: str) -> list[Pair]:
        """The pairs sweep `sweep`'s grids name, as the manifest recorded them."""
        keys = self.grid(sweep).get("pair", [])
        out = []
        for key in (str(k) for k in (keys if isinstance(keys, list) else [keys])):
            record = self.pairs.get(key)
            if record is None:
                raise ValueError(f"pair {key} (sweeps/{sweep}.yaml) is not in the sweep's "
                                 "manifest; run `hacrl report` or the sweep again to record it")
            out.append(Pair.of(key, record))
        return out

    def shares_rollouts(self, method: str) -> bool:
        """Whether one job of `method` trains a whole team (the manifest's `methods`)."""
        record = self.methods.get(method)
        if record is None:
            raise ValueError(f"method {method} is not in the sweep's manifest; run `hacrl "
                             "report` or the sweep again to record it")
        return record.shares_rollouts

    def team(self, method: str, p: Pair, agent: str) -> list[str]:
        """Who trained with `agent` of pair `p` under `method`: the pair, or the agent alone."""
        return list(p.agents) if self.shares_rollouts(method) else [agent]

    def protocol_of(self, sweep: str) -> str:
        return str((self.grid(sweep).get("protocol") or ["main"])[0])

    def value(self, method: str, p: Pair, agent: str, metric: str, sweep: str | None,
              **params: Any) -> Value:
        """`metric` of `agent` under `method` in pair `p` (single-agent methods: the agent's own
        cell, which every pair it is in shares), over all matching cells (e.g. seeds)."""
        cells = find(self.cells, method, self.team(method, p, agent), sweep, **params)
        if not cells:
            return Value(reason="not in this sweep")
        return Value.combine([run_value(self.store, c, agent, metric) for c in cells])
