"""Sweep definitions -> distinct cells.

A sweep (sweeps/<name>.yaml) lists grids: each grid maps config keys to the values to combine
(a cartesian product), plus optional `protocol` (evaluation protocols the cells need),
`benchmarks` (the only benchmarks its tables read, paper names: a cell that no other grid asks
for evaluates just those), `fixed` (overrides every cell of the grid gets) and `cost` (timing
cells: run alone, `repeats` times).
`include` pulls in other sweeps' grids, so `paper` is the union of all tables.

A cell is one training job, identified by the hash of its resolved training config
(`hacrl.config.config_hash`), not by the table that asked for it: single-agent methods are
trained per agent (the GSPO run of Qwen3-4B-Base serves Tables 1 and 9 and every pair it is
in), and a cell asked for by several grids is trained once and evaluated once per protocol.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from hacrl.algo.methods import METHODS
from hacrl.config import CONFIG_DIR, ConfigError, config_hash
from hacrl.config.protocol import paper_benchmark
from hacrl.config.ranges import check_leaf_ranges
from hacrl.core.layout import Layout
from hacrl.schema.sweep_manifest import CellRecord, MethodRecord, PairRecord
from hacrl.sweep.cost_model import cell_work, job_gpus

SWEEP_DIR = CONFIG_DIR / "sweep"  # the repository's sweeps/ links here
# resolved config values kept with each cell (analysis/ places cells in tables by them)
PARAMS = ("pair.name", "algo.alpha", "algo.cross_clip_lower", "algo.delta_step", "train.steps",
          "timing_repeat", "engine.threads")
GRID_KEYS = ("protocol", "benchmarks", "fixed", "cost")
REPORT_KEYS = ("tables", "figures")
SWEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")

Compose = Callable[[list[str]], DictConfig]


class Cell(CellRecord):
    """One distinct training (or, for method=base, evaluation-only) job of a sweep: the record
    the manifest holds (`hacrl.schema.sweep_manifest.CellRecord`) and what the sweep does with
    it."""

    @classmethod
    def of(cls, record: CellRecord) -> Cell:
        return cls(**asdict(record))

    @property
    def label(self) -> str:
        """Short description: method, agents, seed and what else sets this cell apart."""
        extra = []
        for override in self.overrides:
            key, _, value = override.partition("=")
            if key in ("pair", "method", "agents", "seed", "eval.use", "eval.at_end"):
                continue
            if key == "timing_repeat":
                extra.append(f"repeat {value}")
            elif value.startswith("${scale."):
                extra.append(f"{key.split('.')[-1]}={value[8:-1]}")  # steps=cost_steps
            else:
                extra.append(f"{key.split('.')[-1]}={value}")
        return " ".join([self.method, "+".join(self.agents), f"s{self.seed}", *extra])

    def job_overrides(self) -> list[str]:
        """Overrides of the launched job: the cell's own, its protocols and its identity tags."""
        only = [f"eval.only=[{','.join(self.benchmarks)}]"] if self.benchmarks else []
        return [*self.overrides, f"eval.use=[{','.join(self.protocols)}]", *only,
                # quoted: Hydra reads an unquoted hex id like 4355196216e7 or 843811173378 as a
                # number (4.355196216e+16), and the job's state file would miss the sweep's name
                f"cell.id='{self.id}'", f"cell.sweeps=[{','.join(self.sweeps)}]"]


def sweep_file(name: str, dirs: tuple[Path, ...] = (SWEEP_DIR,)) -> Path:
    """sweeps/<name>.yaml, or <dir>/<name>.yaml of a user's config folder on hydra.searchpath."""
    if not SWEEP_NAME.fullmatch(name):
        # the name becomes folder names under the output root (sweeps/<name>, reports/<name>-*)
        raise ConfigError(f"sweep {name!r}: a sweep name is letters, digits, '_' and '-' (it "
                          "names folders under output_root)")
    for folder in dirs:
        if (folder / f"{name}.yaml").is_file():
            return folder / f"{name}.yaml"
    known = sorted({p.stem for folder in dirs for p in folder.glob("*.yaml")})
    raise ConfigError(f"sweep {name!r}: no sweeps/{name}.yaml; known: {', '.join(known)}")


def sweep_dirs(searchpath: Any) -> tuple[Path, ...]:
    """sweeps/, then the `sweep` folder of every file:// entry of `hydra.searchpath` (a user's
    config folder, where their own sweep files are)."""
    extra = [Path(str(p).removeprefix("file://")) / "sweep"
             for p in searchpath or [] if str(p).startswith("file://")]
    return (SWEEP_DIR, *extra)


def searchpath_of(overrides: list[str]) -> list[str]:
    """The entries of a `hydra.searchpath=[...]` command-line override (none: [])."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    found: list[str] = []
    for parsed in OverridesParser.create().parse_overrides(
            [o for o in overrides if o.split("=", 1)[0].lstrip("+~") == "hydra.searchpath"]):
        value = parsed.value()
        found = [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return found


def check_sweep_file(path: Path, entry: bool = False) -> DictConfig:
    """A sweep file hacrl's sweeper can read: valid YAML, a mapping, `override /hydra/sweeper:
    hacrl` among its defaults, `hydra.sweeper.grids` a list of mappings and/or
    `hydra.sweeper.include` a list of sweep names (the defaults checked for the sweep a command
    names, `entry`; an included file takes its includer's). Its config, or one ConfigError naming the
    file, what is wrong and what to do."""
    import yaml

    shape = "see sweeps/README.md for a sweep file's shape"
    try:
        node = OmegaConf.load(path)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML ({problem}{where}); fix the file") from None
    except OSError as err:
        raise ConfigError(f"{path}: unreadable ({err.strerror or err})") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: a sweep file is a mapping (defaults, hydra.sweeper.grids); "
                          f"{shape}")
    defaults = node.get("defaults") or []
    if entry and not any(isinstance(d, DictConfig) and d.get("override /hydra/sweeper") == "hacrl"
               for d in defaults):
        raise ConfigError(f"{path}: not a hacrl sweep: its defaults lack `- override "
                          f"/hydra/sweeper: hacrl`; {shape}")
    sweeper = OmegaConf.select(node, "hydra.sweeper")
    grids = sweeper.get("grids") if isinstance(sweeper, DictConfig) else None
    include = sweeper.get("include") if isinstance(sweeper, DictConfig) else None
    if grids is not None and not (isinstance(grids, ListConfig)
                                  and all(isinstance(g, DictConfig) for g in grids)):
        raise ConfigError(f"{path}: hydra.sweeper.grids must be a list of mappings, e.g. "
                          f"`- pair: size` / `  method: [gspo, hacpo]`; {shape}")
    if include is not None and not (isinstance(include, ListConfig)
                                    and all(isinstance(i, str) for i in include)):
        raise ConfigError(f"{path}: hydra.sweeper.include must be a list of sweep names")
    if not grids and not include:
        raise ConfigError(f"{path}: hydra.sweeper has no grids (and includes no sweep); {shape}")
    return node


def load_grids(name: str, dirs: tuple[Path, ...] = (SWEEP_DIR,),
               seen: tuple[str, ...] = ()) -> list[tuple[str, dict[str, Any]]]:
    """(sweep name, grid) pairs of a sweep, its includes expanded (each sweep once)."""
    if name in seen:
        return []
    node = check_sweep_file(sweep_file(name, dirs))
    sweeper = OmegaConf.select(node, "hydra.sweeper") or {}
    grids: list[tuple[str, dict[str, Any]]] = []
    for included in sweeper.get("include") or []:
        grids += load_grids(str(included), dirs, (*seen, name))
    for grid in sweeper.get("grids") or []:
        plain = OmegaConf.to_container(grid, resolve=False)
        assert isinstance(plain, dict)
        grids.append((name, {str(k): v for k, v in plain.items()}))
    return grids


def all_grids(dirs: tuple[Path, ...] = (SWEEP_DIR,)) -> dict[str, list[dict[str, Any]]]:
    """Sweep name -> its own grids, for every sweep file of the sweep folders (what the report
    lays its tables out by: a table's pairs, methods and protocol are its sweep's grid's)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name in sorted({p.stem for folder in dirs for p in Path(folder).glob("*.yaml")}):
        for sweep, grid in load_grids(name, dirs):
            if grid not in out.setdefault(sweep, []):
                out[sweep].append(grid)
    return out


@dataclass
class ReportKeys:
    """The tables and figures one sweep file names (hydra.sweeper.report.{tables,figures})."""

    file: Path
    tables: list[str]
    figures: list[str]


def load_report_keys(name: str, dirs: tuple[Path, ...] = (SWEEP_DIR,),
                     seen: tuple[str, ...] = ()) -> list[ReportKeys]:
    """Per sweep file, the report keys it names: its includes' first, each sweep once."""
    if name in seen:
        return []
    path = sweep_file(name, dirs)
    sweeper = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper") or {}
    out: list[ReportKeys] = []
    for included in sweeper.get("include") or []:
        out += load_report_keys(str(included), dirs, (*seen, name))
    node = sweeper.get("report") or {}
    report = OmegaConf.to_container(node) if OmegaConf.is_config(node) else node
    if not isinstance(report, dict) or set(report) - set(REPORT_KEYS):
        raise ConfigError(f"{path}: hydra.sweeper.report is a mapping with the keys "
                          f"{' and '.join(REPORT_KEYS)} (lists of report keys), got {report!r}")
    keys = {}
    for kind in REPORT_KEYS:
        value = report.get(kind) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: hydra.sweeper.report.{kind} must be a list of names, "
                              f"e.g. [table1], got {value!r}")
        keys[kind] = value
    return [*out, ReportKeys(path, keys["tables"], keys["figures"])]


def _value(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ",".join(str(x) for x in v) + "]"
    return str(v)


def with_values(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """A copy of `cfg` with plain `key=value` overrides applied (no config groups), each value
    read by Hydra's own override parser: `train.lr=1e-4` is the float Hydra makes of it (YAML
    would keep the string "1e-4"), so the cell's hash is the one its job computes."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = cfg.copy()
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        OmegaConf.update(out, override.key_or_group, override.value(), force_add=True)
    return out


_ABSENT = object()


def _group_names(dirs: tuple[Path, ...]) -> set[str]:
    """Names of the config groups (folders of the config tree, and of the config folder above
    each extra sweep folder): an override of one of these selects a config, not a value."""
    roots = {CONFIG_DIR, *(d.parent for d in dirs)}
    return {p.name for root in roots if root.is_dir() for p in root.iterdir() if p.is_dir()}


def composing_once(compose: Compose, dirs: tuple[Path, ...]) -> Compose:
    """`compose`, with the config of each distinct set of config-group choices composed once.

    A sweep composes a config per grid combination (110 for `paper`), at ~0.1 s each; most
    combinations differ from another only in plain values (`seed=1`, `algo.alpha=2`). Those
    are applied in memory to the composed config of their group choices (`with_values`, which
    reads each value as Hydra does); an override of a key the config lacks is composed in full,
    so Hydra reports it as it always did.
    """
    groups = _group_names(dirs)
    composed: dict[tuple[str, ...], DictConfig] = {}

    def plain(override: str) -> bool:
        key = override.split("=", 1)[0]
        return "=" in override and not key.startswith(("+", "~")) and "/" not in key \
            and key not in groups

    def fast(overrides: list[str]) -> DictConfig:
        choices = tuple(o for o in overrides if not plain(o))
        values = [o for o in overrides if plain(o)]
        if choices not in composed:
            composed[choices] = compose(list(choices))
        base = composed[choices]
        if any(OmegaConf.select(base, v.split("=", 1)[0], default=_ABSENT,
                                throw_on_resolution_failure=False) is _ABSENT
               for v in values):
            return compose(overrides)
        return with_values(base, values) if values else base  # read, never changed

    return fast


def _fill_facts(cell: Cell, cfg: DictConfig) -> None:
    from hacrl.config import check_zoo_draw, model_path, zoo_seed
    from hacrl.config.protocol import Protocol, benchmark_data

    method = METHODS[cell.method]
    cell.trains = method.trains
    cell.run_dir = str(Layout.at(cfg.output_root).run(cell.id, cell.method).path)
    # not checked here: a cell whose model is missing fails alone, with its own message
    cell.model_paths = {a: model_path(cfg, i, a, check=False) for i, a in enumerate(cell.agents)}
    for i, agent in enumerate(cell.agents):  # ... but another zoo draw stops the whole sweep:
        check_zoo_draw(cfg, i, agent, Path(cell.model_paths[agent]))  # no cell is right then
    cell.scale = str(cfg.scale.name)
    cell.zoo_seed = zoo_seed(cfg) or 0
    data = benchmark_data(cfg)
    cell.protocol_keys = {str(name): Protocol.from_config(node, data=data).key
                          for name, node in cfg.eval.protocols.items()}
    cell.benchmarks = [str(b) for b in cfg.eval.benchmarks]  # narrowed by `expand`
    for key in PARAMS:
        value = OmegaConf.select(cfg, key, default=None)
        cell.params[key] = value if value is None or isinstance(value, (int, float, str)) \
            else str(value)


def _estimate(cfg: DictConfig, n_agents: int) -> float:
    """Relative cost of a cell: steps x agents x rollouts (x2 for shared rollouts)."""
    method = METHODS[str(cfg.method.name)]
    if not method.trains:
        return 0.05 * n_agents
    sharing = 2.0 if method.shares_rollouts else 1.0
    return (float(cfg.train.steps) * n_agents * method.rollout_multiplier * sharing
            + 10.0 * n_agents)  # + evaluation


def _axis(sweep: str, key: str, value: Any, compose: Compose) -> list[Any]:
    """The values a grid combines for `key`: a list, one value, or an interpolation of the
    config (`seed: ${scale.seeds}`) resolved to a list at the sweep's scale, so one sweep file
    runs 3 seeds at tiny scale and 1 at paper scale."""
    if isinstance(value, list):
        return value
    if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
        node = OmegaConf.select(compose([]), value[2:-1], default=None)
        resolved = OmegaConf.to_container(node) if OmegaConf.is_config(node) else node
        if not isinstance(resolved, list) or not resolved:
            raise ConfigError(f"sweeps/{sweep}.yaml: {key}: {value} must name a non-empty list "
                              f"of the config, got {resolved!r}")
        return resolved
    return [value]


def pair_records(grids: dict[str, list[dict[str, Any]]],
                 compose: Compose) -> dict[str, PairRecord]:
    """Every pair option the grids name (`grids`: sweep name -> its grids, as `all_grids`), as
    `compose` makes it (the sweep's command line included): what the report lays its tables out
    by, recorded in the manifest so it never reads the config tree itself."""
    keys = dict.fromkeys(str(v) for sweep, sweep_grids in grids.items() for grid in sweep_grids
                         if "pair" in grid for v in _axis(sweep, "pair", grid["pair"], compose))
    return {key: pair_record(key, compose) for key in keys}


def recorded_facts(grids: dict[str, list[dict[str, Any]]], compose: Compose) -> dict[str, Any]:
    """What a manifest records for the report next to `grids`: `pairs` and `methods`."""
    return {"pairs": pair_records(grids, compose), "methods": method_records()}


def pair_record(key: str, compose: Compose) -> PairRecord:
    """Pair option `key` (experiments/pair/<key>.yaml) as `compose` makes it."""
    pair = compose([f"pair={key}"]).pair
    return PairRecord(str(pair.name), str(pair.setting), [str(a) for a in pair.agents])


def method_records() -> dict[str, MethodRecord]:
    """Every registered method's facts the report needs (who trains together)."""
    return {name: MethodRecord(m.shares_rollouts, m.trains) for name, m in METHODS.items()}


@dataclass
class Expansion:
    cells: list[Cell]
    asked: int  # cells the grids ask for before deduplication


def _check_ranges(sweep: str, base: list[str], cfg: DictConfig) -> None:
    """A cell's values in their ranges (`hacrl.config.ranges`), each refusal naming the cell."""
    try:
        check_leaf_ranges(cfg)
    except ConfigError as err:
        cell = " ".join(base) or "(no overrides)"
        raise ConfigError("\n".join(f"sweeps/{sweep}.yaml, cell {cell}: {line}"
                                     for line in str(err).splitlines())) from None


def expand(name: str, compose: Compose, dirs: tuple[Path, ...] = (SWEEP_DIR,)) -> Expansion:
    """The distinct cells of sweep `name`, in first-asked order (`compose`: a cell's config
    from its overrides; a sweep passes one that composes each set of group choices once)."""
    cells: dict[str, Cell] = {}
    wanted: dict[str, set[str] | None] = {}  # cell -> the benchmarks its grids read (None: all)
    configs: dict[str, DictConfig] = {}  # cell -> the config it was first composed with
    asked = 0
    for sweep, grid in load_grids(name, dirs):
        unknown = [k for k in grid if k in ("include", "grids")]
        if unknown:
            raise ConfigError(f"sweeps/{sweep}.yaml: {unknown[0]} belongs under hydra.sweeper")
        protocols = [str(p) for p in grid.get("protocol") or ["main"]]
        fixed = [str(o) for o in grid.get("fixed") or []]
        cost = grid.get("cost") or {}
        repeats = int(cost.get("repeats", 3)) if cost else 1
        axes = {k: _axis(sweep, k, v, compose) for k, v in grid.items() if k not in GRID_KEYS}
        for combo in itertools.product(*axes.values()):
            base = [f"{k}={_value(v)}" for k, v in zip(axes, combo, strict=True)] + fixed
            cfg = compose(base)
            _check_ranges(sweep, base, cfg)
            reads = _benchmarks(sweep, grid.get("benchmarks"), cfg)
            method = METHODS.get(str(cfg.method.name))
            if method is None:
                raise ConfigError(f"sweeps/{sweep}.yaml: method={cfg.method.name} is not registered")
            agents = [str(a) for a in cfg.agents]
            teams = [agents] if method.shares_rollouts else [[a] for a in agents]
            for team in teams:
                # plain key=value overrides are applied in memory: composing costs ~0.1 s
                split = [f"agents=[{','.join(team)}]"] if team != agents else []
                for repeat in range(repeats):
                    asked += 1
                    timing = ([f"timing_repeat={repeat}", "eval.at_end=false",
                               *[str(o) for o in cost.get("overrides") or []]] if cost else [])
                    overrides = [*base, *split, *timing]
                    cell_cfg = with_values(cfg, [*split, *timing]) if split or timing else cfg
                    key = config_hash(cell_cfg)
                    cell = cells.get(key)
                    if cell is None:
                        cell = cells[key] = Cell(key, overrides, method.name, team,
                                                 int(cell_cfg.seed), cost=bool(cost),
                                                 estimate=_estimate(cell_cfg, len(team)))
                        _fill_facts(cell, cell_cfg)
                        cell.gpus = job_gpus(cell_cfg)
                        configs[key] = cell_cfg
                    if sweep not in cell.sweeps:
                        cell.sweeps.append(sweep)
                    if not cost:
                        cell.protocols += [p for p in protocols if p not in cell.protocols]
                        before = wanted.get(key, set())
                        wanted[key] = None if reads is None or before is None else before | reads
    for key, cell in cells.items():
        if not cell.protocols:
            cell.protocols = ["main"]  # timing cells evaluate nothing; the list is never empty
        reads = wanted.get(key)
        if reads is not None:  # every grid that asked for it reads only these
            cell.benchmarks = [b for b in cell.benchmarks if paper_benchmark(b) in reads]
        # what it costs, from the config of its first grid (equal cells train alike)
        cell.work = cell_work(configs[key], cell.agents, cell.benchmarks, cell.protocols)
    return Expansion(list(cells.values()), asked)


def _benchmarks(sweep: str, value: Any, cfg: DictConfig) -> set[str] | None:
    """A grid's `benchmarks` (paper names) as a set; None: the grid reads every benchmark."""
    if value is None:
        return None
    known = {paper_benchmark(str(b)) for b in cfg.eval.benchmarks}
    if not isinstance(value, list) or not value or any(str(b) not in known for b in value):
        raise ConfigError(f"sweeps/{sweep}.yaml: benchmarks={value!r}: a non-empty list of the "
                          f"paper's benchmarks ({', '.join(sorted(known))})")
    return {str(b) for b in value}
