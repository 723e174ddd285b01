"""Which cell of A `hacrl compare` sets beside which cell of B, from the two sweeps' manifests.

A cell of A pairs with a cell of B when they are the same training but for what differs between
the two sweeps: the same method, agents and seed, and the same grid overrides once the
sweep-wide keys are left out. Sweep-wide are the keys either command line set (the manifest's
`arguments`, e.g. `algo.alpha=1` vs `algo.alpha=2`), keys a grid sets to one value for every
cell of A and to another (or none) for every cell of B (`fixed: [algo.alpha=2]` in one sweep
file), and the keys `--ignore` names. A group (`GroupKey`) is a cell over its seeds (method,
agents, grid overrides). What pairs with nothing is an `Unpaired`, with the reason: only in A or
B (a whole cell or one seed), a timing cell, or a second cell of one identity on one side.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from hacrl.schema.sweep_manifest import CellRecord, SweepManifest

IDENTITY = ("seed", "agents")    # a cell's own fields, not compared as overrides
# keys of a command line that say where things go, not what is trained
_PLACES = ("sweep", "output_root", "tracking.uri")


def setting(override: str) -> str:
    """The key an override sets: `+algo.alpha=2` -> `algo.alpha`."""
    return override.split("=", 1)[0].lstrip("+~")


def settings_of(overrides: Iterable[str]) -> dict[str, str]:
    """key -> the value the overrides set it to (`""` for a key deleted or set bare)."""
    return {setting(o): o.split("=", 1)[1] if "=" in o else "" for o in overrides}


@dataclass(frozen=True)
class GroupKey:
    """A cell over its seeds: method, agents, and its grid overrides less the sweep-wide keys."""

    method: str
    agents: tuple[str, ...]
    grid: tuple[str, ...]

    @property
    def label(self) -> str:
        rest = [o for o in self.grid if setting(o) != "method"]
        return " ".join([self.method, *rest])


@dataclass(frozen=True)
class Unpaired:
    """Something of A or B that is not compared, and why."""

    what: str      # e.g. "hacpo pair=size seed 3" or "... seed 2, qwen3-4b-base"
    reason: str    # e.g. "only in B", "no finished run in A (failed)"


@dataclass
class Pairing:
    """The cells of A and B placed side by side."""

    groups: dict[GroupKey, tuple[dict[int, CellRecord], dict[int, CellRecord]]]
    differs: list[str]            # "algo.alpha: 1 -> 2 (command line)", ...
    unpaired: list[Unpaired] = field(default_factory=list)


def pair_cells(a: SweepManifest, b: SweepManifest, ignore: Iterable[str] = ()) -> Pairing:
    """Group both sides' cells by identity (method, agents, grid overrides less the sweep-wide
    keys) and seed; list what is only on one side, the timing cells (never evaluated) and cells
    one side has twice under one identity (they differ only in keys left out)."""
    args_a, args_b = settings_of(a.arguments), settings_of(b.arguments)
    wide = set(args_a) | set(args_b) | {setting(k) for k in ignore}
    differs = [f"{key}: {args_a.get(key, '(not set)')} -> {args_b.get(key, '(not set)')} "
               "(command line)" for key in sorted(set(args_a) | set(args_b))
               if args_a.get(key) != args_b.get(key) and key not in _PLACES
               and not key.startswith("hydra.")]
    differs += [f"{key}: (ignored, --ignore)" for key in sorted({setting(k) for k in ignore})]
    unpaired: list[Unpaired] = []
    cells: list[list[CellRecord]] = []
    for side, manifest in (("A", a), ("B", b)):
        kept = []
        for cell in manifest.cells:
            if cell.cost:
                unpaired.append(Unpaired(cell_what(cell), f"timing cell of {side}: never "
                                         "evaluated"))
            else:
                kept.append(cell)
        cells.append(kept)
    by_grid = _grid_differences(cells[0], cells[1], wide | set(IDENTITY))
    for name, (va, vb) in sorted(by_grid.items()):
        differs.append(f"{name}: {va or '(not set)'} -> {vb or '(not set)'} (grids)")
    wide |= set(by_grid)
    groups: dict[GroupKey, tuple[dict[int, CellRecord], dict[int, CellRecord]]] = {}
    for index, (side, kept) in enumerate((("A", cells[0]), ("B", cells[1]))):
        for cell in kept:
            group = GroupKey(cell.method, tuple(cell.agents), tuple(sorted(
                o for o in cell.overrides if setting(o) not in wide | set(IDENTITY))))
            seeds = groups.setdefault(group, ({}, {}))[index]
            if cell.seed in seeds:
                unpaired.append(Unpaired(cell_what(cell), f"{side} has another cell of this "
                                         f"identity ({seeds[cell.seed].id}); the keys left out "
                                         "tell them apart"))
                continue
            seeds[cell.seed] = cell
    for group, (in_a, in_b) in groups.items():
        for seed in sorted(set(in_a) ^ set(in_b)):
            unpaired.append(Unpaired(f"{group.label} seed {seed}",
                                     "only in A" if seed in in_a else "only in B"))
    return Pairing(groups, differs, unpaired)


def _grid_differences(a: list[CellRecord], b: list[CellRecord], skip: set[str]
                      ) -> dict[str, tuple[str, str]]:
    """Grid keys set to one value (or left unset) in every cell of A and to another in every
    cell of B: sweep-wide differences spelt in the sweep files rather than on the command line."""
    if not a or not b:
        return {}
    keys = {setting(o) for cell in [*a, *b] for o in cell.overrides} - skip

    def values(cells: list[CellRecord], key: str) -> set[str]:
        return {settings_of(c.overrides).get(key, "") for c in cells}

    out = {}
    for key in keys:
        va, vb = values(a, key), values(b, key)
        if len(va) == 1 and len(vb) == 1 and va != vb:
            out[key] = (va.pop(), vb.pop())
    return out


def cell_what(cell: CellRecord) -> str:
    """A cell as the lists name it: method, grid overrides, seed and agents."""
    rest = [o for o in cell.overrides if setting(o) not in ("method", "seed", "agents")]
    return " ".join([cell.method, *rest, f"seed {cell.seed}", "+".join(cell.agents)])
