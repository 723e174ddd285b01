"""`hacrl compare A B`: did a change help or hurt, beyond the noise?

A and B are two sweeps' results, or one sweep's runs at two git commits (`parse_spec` names
the forms). The command line on top reads each side's manifest (`hacrl.schema.sweep_manifest`)
and opens its store (`analysis.store`); everything else happens here, from those records and the
runs' per-problem outcomes (`analysis.outcomes`), never from the sweep's code.

Pairing
-------
A cell of A pairs with a cell of B when they are the same training but for what differs between
the two sweeps: the same method, agents and seed, and the same grid overrides once the
sweep-wide keys are left out. Sweep-wide are the keys either command line set (the manifest's
`arguments`, e.g. `algo.alpha=1` vs `algo.alpha=2`), keys a grid sets to one value for every
cell of A and to another (or none) for every cell of B (`fixed: [algo.alpha=2]` in one sweep
file), and the keys `--ignore` names. A group is a cell over its seeds (method, agents, grid
overrides); per agent of it, the seeds both sides ran with a finished, evaluated run are
compared (the latest FINISHED run of the cell's config hash with the protocol's AVG, as the
report picks it; with `@COMMIT` only runs whose `git_commit` tag, or for an evaluation run
MLflow's source commit, starts with it, and where the change made a cell's config hash another,
the run the sweep made at that commit with the cell's method, seed, agent, team and grid
settings, said in a note). Whatever cannot be compared is listed with the reason: only in A
or B (a whole cell or one seed), no finished run, no per-problem outcomes logged, benchmarks or
problems that differ. A group whose runs are the very same runs in A and B (a single-agent baseline the
changed key does not reach, trained once for both sweeps) is listed as unchanged, not tested.

Statistics
----------
Per group, agent, benchmark and AVG (over the benchmarks both sides have): the paired
difference B - A (`analysis.stats.paired_difference`: problems x seeds, seeds paired, problems
paired), in points, positive when B is better, with its 95% interval and two-sided p; each side's
accuracy with its own interval (`cell_estimates`). Every such test of one comparison is one
family under Holm's correction (`analysis.verdicts.judge`): "better" or "worse" is significant
after it; anything else is "no difference inside the noise" with the MDE (80% power at alpha / m)
of the design. Flips: per (seed, problem), "solved" means at least half of its samples correct
(greedy: its one answer); `lost` counts those solved in A and not in B, `gained` the reverse.

Exit decision
-------------
`exit_code`: 0, or `REGRESSION_EXIT` (3) with `--fail-on-regression` when a comparison is
"worse" after Holm and B - A is below -tolerance points. Bad input is a `CompareError` (exit 2).
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.cell_values import run_value
from analysis.outcomes import OutcomesError, aligned_problem_means, read_outcomes
from analysis.stats import AVG, Difference, Estimate, cell_estimates, paired_difference
from analysis.store import Store
from analysis.table import Entry, Table
from analysis.verdicts import CONTRADICTED, SUPPORTED, Comparison, judge
from hacrl.core.errors import HacrlError
from hacrl.core.layout import Layout
from hacrl.schema import metric_names as M
from hacrl.schema import tags as T
from hacrl.schema.sweep_manifest import FILE_NAME, CellRecord, SweepManifest

REGRESSION_EXIT = 3          # --fail-on-regression found a significant regression
BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no difference inside the noise"
SOLVED = 0.5                 # a (seed, problem) is solved when this share of its samples is
FORMS = ("a sweep folder (<output_root>/sweeps/NAME, holding its manifest.json), ROOT::NAME "
         "(sweep NAME under output root ROOT) or NAME (under the command's output_root), each "
         "optionally followed by @COMMIT (4-40 hex digits: only the runs made at a git commit "
         "starting with them)")
_COMMIT = re.compile(r"[0-9a-fA-F]{4,40}")
_NAME = re.compile(r"[\w.-]+")
# keys of a command line that say where things go, not what is trained
_PLACES = ("sweep", "output_root", "tracking.uri")


class CompareError(HacrlError):
    """Input `hacrl compare` cannot work with: one line naming it and the forms it takes."""

    exit_code = 2


# -- what A and B are --------------------------------------------------------------------------

@dataclass(frozen=True)
class SweepSpec:
    """One side as given: a sweep folder, and optionally a commit prefix its runs must have."""

    text: str                    # as typed
    folder: Path                 # <root>/sweeps/<name>
    commit: str | None = None    # lower-case hex prefix of the runs' git commit

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def label(self) -> str:
        return self.name + (f"@{self.commit}" if self.commit else "")


def parse_spec(text: str, output_root: Path | str, side: str) -> SweepSpec:
    """`text` as a sweep (see `FORMS`); `side` ("A" or "B") names it in errors."""
    body, commit = text, None
    if "@" in text and not Path(os.path.expanduser(text)).is_dir():
        body, _, commit = text.rpartition("@")
        if not body or not _COMMIT.fullmatch(commit):
            raise CompareError(f"{side}={text!r}: @{commit} is not a commit prefix; {side} is "
                               f"{FORMS}")
        commit = commit.lower()
    if "::" in body:
        root, _, name = body.partition("::")
        if not root or not _NAME.fullmatch(name):
            raise CompareError(f"{side}={text!r} is not a sweep; {side} is {FORMS}")
        folder = Layout.at(root).sweep(name).path
    elif "/" in body or body.startswith((".", "~")):
        folder = Path(os.path.expanduser(body)).resolve()
    elif _NAME.fullmatch(body):
        folder = Layout.at(output_root).sweep(body).path
    else:
        raise CompareError(f"{side}={text!r} is not a sweep; {side} is {FORMS}")
    return SweepSpec(text, folder, commit)


def check_folder(spec: SweepSpec, side: str) -> None:
    """The folder exists and holds a manifest (CompareError otherwise, naming what to pass)."""
    if not spec.folder.is_dir():
        raise CompareError(f"{side}={spec.text!r}: no sweep folder {spec.folder}; run the sweep "
                           "first, or name the folder it ran in (ROOT::NAME, or output_root=...)")
    if not (spec.folder / FILE_NAME).is_file():
        raise CompareError(f"{side}={spec.text!r}: {spec.folder} holds no {FILE_NAME}, so it is "
                           f"not a sweep's folder; {side} is {FORMS}")


def labels(a: SweepSpec, b: SweepSpec) -> tuple[str, str]:
    """Names of the two sides for titles and the report folder (safe as file names)."""
    if a.folder == b.folder and a.commit == b.commit:
        raise CompareError(f"A={a.text!r} and B={b.text!r} are the same runs: compare two sweeps, "
                           "or one sweep at two commits (NAME@COMMIT)")
    la, lb = a.label, b.label
    if la == lb:  # the same sweep name in two output roots
        la, lb = f"{a.folder.parent.parent.name}.{la}", f"{b.folder.parent.parent.name}.{lb}"
    if la == lb:
        la, lb = f"{la}-a", f"{lb}-b"
    return _safe(la), _safe(lb)


def _safe(text: str) -> str:
    return re.sub(r"[^\w.@-]+", "_", text)


@dataclass
class Side:
    """One side, read: its spec, the sweep's record and the store its runs are in."""

    spec: SweepSpec
    manifest: SweepManifest
    store: Store
    label: str = ""

    def runs(self) -> Store:
        """The store as this side sees it: only the runs at its commit, if it names one."""
        return at_commit(self.store, self.spec.commit)


def at_commit(store: Store, commit: str | None) -> Store:
    """`store` with only the runs whose git commit starts with `commit` (the job's `git_commit`
    tag, else MLflow's source commit: an evaluation run carries only that one)."""
    if not commit:
        return store
    runs = store.runs
    own = runs[T.GIT_COMMIT].fillna("").astype(str)
    source = runs[T.SOURCE_COMMIT].fillna("").astype(str)
    made = own.where(own != "", source).str.lower()
    return replace(store, runs=runs[made.str.startswith(commit)])


# -- pairing -------------------------------------------------------------------------------------

def setting(override: str) -> str:
    """The key an override sets: `+algo.alpha=2` -> `algo.alpha`."""
    return override.split("=", 1)[0].lstrip("+~")


def _settings(overrides: Iterable[str]) -> dict[str, str]:
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


IDENTITY = ("seed", "agents")    # a cell's own fields, not compared as overrides


def pair_cells(a: SweepManifest, b: SweepManifest, ignore: Iterable[str] = ()) -> Pairing:
    """Group both sides' cells by identity (method, agents, grid overrides less the sweep-wide
    keys) and seed; list what is only on one side, the timing cells (never evaluated) and cells
    one side has twice under one identity (they differ only in keys left out)."""
    args_a, args_b = _settings(a.arguments), _settings(b.arguments)
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
                unpaired.append(Unpaired(_cell_what(cell), f"timing cell of {side}: never "
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
                unpaired.append(Unpaired(_cell_what(cell), f"{side} has another cell of this "
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
        return {_settings(c.overrides).get(key, "") for c in cells}

    out = {}
    for key in keys:
        va, vb = values(a, key), values(b, key)
        if len(va) == 1 and len(vb) == 1 and va != vb:
            out[key] = (va.pop(), vb.pop())
    return out


def _cell_what(cell: CellRecord) -> str:
    rest = [o for o in cell.overrides if setting(o) not in ("method", "seed", "agents")]
    return " ".join([cell.method, *rest, f"seed {cell.seed}", "+".join(cell.agents)])


# -- the comparison ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """B - A of one group's agent on one benchmark (or AVG) over the seeds both ran."""

    group: str
    agent: str
    benchmark: str
    seeds: tuple[int, ...]
    a: Estimate
    b: Estimate
    diff: Difference             # B - A
    verdict: Comparison          # Holm over every test of the comparison
    lost: int                    # (seed, problem) solved in A and not in B
    gained: int                  # ... solved in B and not in A
    cases: int                   # seeds x problems
    runs_a: tuple[str, ...] = ()  # the MLflow runs of each seed, in `seeds`' order
    runs_b: tuple[str, ...] = ()

    @property
    def outcome(self) -> str:
        return {SUPPORTED: BETTER, CONTRADICTED: WORSE}.get(self.verdict.verdict, NO_DIFFERENCE)

    @property
    def label(self) -> str:
        return f"{self.group}, {self.agent}, {self.benchmark}"


@dataclass
class CompareResult:
    a: str                       # the sides' labels
    b: str
    sources: tuple[str, str]     # where each side's runs come from
    differs: list[str]
    rows: list[Row]
    unpaired: list[Unpaired]
    unchanged: list[str]         # groups whose runs are the same runs in A and B
    protocol: str
    alpha: float = 0.05
    notes: list[str] = field(default_factory=list)   # runs found by identity at a commit

    @property
    def tests(self) -> int:
        return len(self.rows)

    def regressions(self, tolerance: float) -> list[Row]:
        """Rows significantly worse in B after Holm, by more than `tolerance` points."""
        return [r for r in self.rows if r.outcome == WORSE and -r.diff.estimate * 100 > tolerance]


def exit_code(result: CompareResult, fail_on_regression: bool, tolerance: float) -> int:
    """0, or REGRESSION_EXIT when asked to fail on a regression and there is one."""
    return REGRESSION_EXIT if fail_on_regression and result.regressions(tolerance) else 0


@dataclass(frozen=True)
class Paired:
    """One group's agent, read: both sides' scores over the seeds both ran, aligned."""

    group: str
    agent: str
    seeds: tuple[int, ...]
    a: dict[str, np.ndarray]     # benchmark -> [seeds, problems]
    b: dict[str, np.ndarray]
    runs_a: tuple[str, ...] = ()
    runs_b: tuple[str, ...] = ()


@dataclass
class _Picked:
    """One side's runs of one group's agent: seed -> run id, and why a seed has none."""

    runs: dict[int, str] = field(default_factory=dict)
    why: dict[int, str] = field(default_factory=dict)


def default_protocol(*manifests: SweepManifest) -> str:
    """`main` when the cells evaluate it (a cell that lists none: an older manifest, main),
    else the protocol most of their cells evaluate (`table2`'s cells: `ablation`)."""
    counts: dict[str, int] = {}
    for manifest in manifests:
        for cell in manifest.cells:
            if not cell.cost:
                for protocol in cell.protocols or ["main"]:
                    counts[protocol] = counts.get(protocol, 0) + 1
    if "main" in counts or not counts:
        return "main"
    return max(counts, key=lambda p: counts[p])


def compare(a: Side, b: Side, *, ignore: Sequence[str] = (), protocol: str | None = None,
            n_boot: int = 2000, alpha: float = 0.05) -> CompareResult:
    """B - A for every pair of cells (see the module's doc) under `protocol` (default:
    `default_protocol`); CompareError when a side has no finished cell or nothing pairs."""
    protocol = protocol or default_protocol(a.manifest, b.manifest)
    pairing = pair_cells(a.manifest, b.manifest, ignore)
    if a.spec.commit != b.spec.commit:
        pairing.differs.insert(0, f"commit: {a.spec.commit or '(any)'} -> "
                                  f"{b.spec.commit or '(any)'}")
    stores = (a.runs(), b.runs())
    pickers = [_Picker(side, store, protocol) for side, store in zip((a, b), stores, strict=True)]
    picked: dict[tuple[GroupKey, str], tuple[_Picked, _Picked]] = {}
    for key, sides in pairing.groups.items():
        for agent in key.agents:
            picked[(key, agent)] = (pickers[0].pick(sides[0], agent),
                                    pickers[1].pick(sides[1], agent))
    for index, side in enumerate((a, b)):
        if not any(p[index].runs for p in picked.values()):
            at = f" at commit {side.spec.commit}" if side.spec.commit else ""
            cells = sum(1 for c in side.manifest.cells if not c.cost)
            raise CompareError(f"{'AB'[index]}={side.spec.text!r}: none of its {cells} cells "
                               f"has a finished run evaluated under protocol {protocol}{at} in "
                               f"{side.store.uri} (`hacrl status {side.spec.name}`)")
    outcomes = [read_outcomes(stores[i], sorted({r for p in picked.values()
                                                 for r in p[i].runs.values()}), protocol)
                for i in (0, 1)]
    same_store = (a.store.uri, a.store.experiment) == (b.store.uri, b.store.experiment)
    unpaired, unchanged = list(pairing.unpaired), []
    pending: list[Paired] = []
    for (key, agent), (pa, pb) in picked.items():
        in_a, in_b = pairing.groups[key]
        common = []
        for seed in sorted(set(in_a) & set(in_b)):
            what = f"{key.label} seed {seed}, {agent}"
            why = [_why(side, p, seed, o.missing)
                   for side, p, o in (("A", pa, outcomes[0]), ("B", pb, outcomes[1]))]
            if any(why):
                unpaired.append(Unpaired(what, "; ".join(w for w in why if w)))
            else:
                common.append(seed)
        if not common:
            continue
        ids_a, ids_b = [pa.runs[s] for s in common], [pb.runs[s] for s in common]
        if same_store and ids_a == ids_b:
            unchanged.append(f"{key.label}, {agent} (seeds {_seeds(common)}): the same runs in A "
                             "and B")
            continue
        scores = _aligned(outcomes[0].table, ids_a, outcomes[1].table, ids_b)
        if isinstance(scores, str):
            unpaired.append(Unpaired(f"{key.label} seeds {_seeds(common)}, {agent}", scores))
            continue
        pending.append(Paired(key.label, agent, tuple(common), *scores, tuple(ids_a),
                              tuple(ids_b)))
    if not pending:
        reasons: dict[str, int] = {}
        for u in unpaired:
            reasons[u.reason] = reasons.get(u.reason, 0) + 1
        said = "; ".join(f"{n} x {r}" for r, n in reasons.items()) or "no cells"
        if unchanged:
            said += f"; {len(unchanged)} x the same runs in A and B"
        raise CompareError(f"nothing of A={a.spec.text!r} pairs with B={b.spec.text!r}: {said}")
    rows = judged(pending, n_boot=n_boot, alpha=alpha)
    sources = tuple(_source(side) for side in (a, b))
    return CompareResult(a.label or a.spec.label, b.label or b.spec.label,
                         (sources[0], sources[1]), pairing.differs, rows, unpaired, unchanged,
                         protocol, alpha, [*pickers[0].notes, *pickers[1].notes])


class _Picker:
    """Which run of a side stands for a cell's agent: the latest FINISHED run of the cell's
    config hash with the protocol's AVG (as the report picks it). At a commit, a cell whose
    hash has no such run there (the change made its config hash another) is found by identity
    among the runs the sweep made at that commit: the same method, seed, agent and team, and
    the cell's grid settings among the run's params; several such cells are ambiguous."""

    def __init__(self, side: Side, store: Store, protocol: str) -> None:
        self.side, self.store, self.protocol = side, store, protocol
        self.metric = M.eval_avg(protocol)
        self.notes: list[str] = []
        self._params: dict[str, dict[str, str]] = {}

    def pick(self, cells: dict[int, CellRecord], agent: str) -> _Picked:
        out = _Picked()
        for seed, cell in cells.items():
            if cell.protocols and self.protocol not in cell.protocols:
                out.why[seed] = (f"not evaluated under protocol {self.protocol} (its: "
                                 f"{', '.join(cell.protocols)})")
                continue
            value = run_value(self.store, cell, agent, self.metric)
            if value.values:
                out.runs[seed] = value.run_ids[0]
                continue
            out.why[seed] = value.reason or "not run"
            if self.side.spec.commit and cell.trains:
                found, why = self._by_identity(cell, agent)
                if found:
                    out.runs[seed] = found
                elif why:
                    out.why[seed] = why
        return out

    def _by_identity(self, cell: CellRecord, agent: str) -> tuple[str | None, str]:
        runs, sweep = self.store.runs, self.side.manifest.sweep or self.side.spec.name
        if self.metric not in runs:
            return None, ""
        made_by = runs[T.SWEEPS].fillna("").astype(str).str.split(",").map(
            lambda s: sweep in s).astype(bool)
        found = runs[made_by & (runs[T.KIND] == T.AGENT) & (runs[T.MODEL] == agent)
                     & (runs[T.METHOD] == cell.method) & (runs[T.SEED] == str(cell.seed))
                     & (runs["status"] == "FINISHED") & runs[self.metric].notna()]
        if found.empty:
            return None, ""
        teams = runs[runs[T.KIND] == T.AGENT].groupby(T.PARENT)[T.MODEL].agg(frozenset)
        found = found[found[T.PARENT].map(
            lambda job: teams.get(job) == frozenset(cell.agents)).astype(bool)]
        grid = _settings(o for o in cell.overrides
                         if setting(o) not in ("pair", "method", *IDENTITY))
        hashes = [h for h, rows in found.groupby(T.CONFIG_HASH, sort=False)
                  if self._has(str(rows.iloc[0]["run_id"]), grid)]
        what = f"{self.side.label or self.side.spec.label}: {_cell_what(cell)}, {agent}"
        if len(hashes) > 1:
            return None, (f"{len(hashes)} cells of the sweep at commit {self.side.spec.commit} "
                          f"match by identity (config hashes {', '.join(sorted(map(str, hashes)))})")
        if not hashes:
            return None, ""
        run = str(found[found[T.CONFIG_HASH] == hashes[0]].iloc[0]["run_id"])
        self.notes.append(f"{what}: run {run} at commit {self.side.spec.commit} found by "
                          f"identity (its config hash {hashes[0]}, the manifest's {cell.id})")
        return run, ""

    def _has(self, run_id: str, grid: dict[str, str]) -> bool:
        """The run's params hold the cell's grid settings (a config group choice, which no
        param names, is not checked)."""
        if run_id not in self._params:
            self._params[run_id] = dict(self.store.client.get_run(run_id).data.params)
        params = self._params[run_id]
        return all(_same_value(params[k], v) for k, v in grid.items() if k in params)


def _same_value(a: str, b: str) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    except ValueError:
        return a.strip("'\"") == b.strip("'\"")


def _why(side: str, picked: _Picked, seed: int, missing: list[str]) -> str:
    if seed not in picked.runs:
        return f"no finished run in {side} ({picked.why.get(seed, 'not run')})"
    if picked.runs[seed] in missing:
        return f"no per-problem outcomes logged in {side} (run {picked.runs[seed]})"
    return ""


def _seeds(seeds: Iterable[int]) -> str:
    return ",".join(str(s) for s in seeds)


def _aligned(table_a: pd.DataFrame, ids_a: list[str], table_b: pd.DataFrame, ids_b: list[str]
             ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | str:
    """Both sides' scores [seeds, problems] per benchmark both have, problems aligned; or why
    not (benchmarks or problems that differ). Run ids are kept apart by side: a copied store
    holds the same ids with other outcomes."""
    table = pd.concat([table_a[table_a["run_id"].isin(ids_a)].assign(
                           run_id=lambda t: "A:" + t["run_id"]),
                       table_b[table_b["run_id"].isin(ids_b)].assign(
                           run_id=lambda t: "B:" + t["run_id"])], ignore_index=True)
    runs = [f"A:{r}" for r in ids_a] + [f"B:{r}" for r in ids_b]
    per_run = table.groupby("run_id")["benchmark"].unique()
    have = [set(per_run.get(r, [])) for r in runs]
    common = sorted(set.intersection(*have))
    if not common:
        return (f"benchmarks differ: A has {', '.join(sorted(set().union(*have[:len(ids_a)])))}"
                f"; B has {', '.join(sorted(set().union(*have[len(ids_a):])))}")
    try:
        scores = aligned_problem_means(table, runs, common)
    except OutcomesError as err:
        return f"problems differ ({err})"
    n = len(ids_a)
    return {k: m[:n] for k, m in scores.items()}, {k: m[n:] for k, m in scores.items()}


def judged(pending: Sequence[Paired], *, n_boot: int = 2000, alpha: float = 0.05
           ) -> list[Row]:
    """Every benchmark's and AVG's B - A of every paired group and agent, with both sides'
    accuracies and the flips; Holm over all of them (one family)."""
    made: list[tuple[Paired, str, Estimate, Estimate, Difference, tuple[int, int, int]]] = []
    for p in pending:
        diff = paired_difference(p.b, p.a, n_boot=n_boot, alpha=alpha)
        est_a, est_b = cell_estimates(p.a, n_boot=n_boot), cell_estimates(p.b, n_boot=n_boot)
        flips = {name: flip_counts(p.a[name], p.b[name]) for name in p.a}
        lost, gained, cases = (sum(f[i] for f in flips.values()) for i in range(3))
        flips[AVG] = (lost, gained, cases)
        made += [(p, name, est_a[name], est_b[name], diff[name], flips[name])
                 for name in [*p.a, AVG]]
    verdict = judge("B vs A", [(f"{p.group}, {p.agent}, {name}", d)
                               for p, name, _, _, d, _ in made], alpha=alpha)
    return [Row(p.group, p.agent, name, p.seeds, ea, eb, d, c, *f, p.runs_a, p.runs_b)
            for (p, name, ea, eb, d, f), c in zip(made, verdict.comparisons, strict=True)]


def flip_counts(a: np.ndarray, b: np.ndarray) -> tuple[int, int, int]:
    """(lost, gained, cases) over (seed, problem): solved in A and not in B, the reverse, and
    how many there are; solved = at least `SOLVED` of its samples correct."""
    solved_a, solved_b = np.asarray(a) >= SOLVED, np.asarray(b) >= SOLVED
    return (int(np.sum(solved_a & ~solved_b)), int(np.sum(~solved_a & solved_b)),
            int(solved_a.size))


def _source(side: Side) -> str:
    at = f", runs at commit {side.spec.commit}..." if side.spec.commit else ""
    return (f"sweep {side.manifest.sweep or side.spec.name} ({side.spec.folder}){at}; store "
            f"{side.store.uri}, experiment {side.store.experiment}")


# -- rendering -----------------------------------------------------------------------------------

COLUMNS = ("cell", "agent", "benchmark", "seeds", "A % [95% CI]", "B % [95% CI]",
           "B - A pt [95% CI]", "p", "p Holm", "verdict", "solved: lost / gained")


def _acc(e: Estimate) -> str:
    return f"{e.estimate * 100:.1f} [{e.lo * 100:.1f}, {e.hi * 100:.1f}]"


def _diff(d: Difference) -> str:
    return f"{d.estimate * 100:+.2f} [{d.lo * 100:+.2f}, {d.hi * 100:+.2f}]"


def _p(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.2g}" if p >= 0.001 else "<0.001"


def verdict_text(row: Row) -> str:
    if row.outcome != NO_DIFFERENCE or row.verdict.mde is None:
        return row.outcome
    if row.diff.estimate == 0 and row.diff.se == 0:  # nothing to estimate a noise from
        return "no difference: the same score on every problem"
    return f"{row.outcome} (MDE {row.verdict.mde * 100:.1f} pt)"


def _cells(row: Row) -> list[str]:
    return [row.group, row.agent, row.benchmark, _seeds(row.seeds), _acc(row.a), _acc(row.b),
            _diff(row.diff), _p(row.diff.p), _p(row.verdict.p_adjusted), verdict_text(row),
            f"{row.lost} / {row.gained} of {row.cases}"]


def how_to_read(result: CompareResult) -> list[str]:
    return [
        f"Accuracies in % under protocol {result.protocol}, each with its 95% interval over "
        "problems and seeds; B - A in points (positive: B is better), paired by seed and by "
        "problem over the seeds both sides ran, with its 95% interval and two-sided p.",
        f"Holm's correction over all {result.tests} tests of this comparison (every benchmark "
        f"and AVG of every cell and agent) at alpha {result.alpha:g}: better / worse are "
        "significant after it; otherwise no difference inside the noise, with the MDE (the "
        "difference this design finds with 80% power at alpha / m).",
        f"Solved: a (seed, problem) whose samples are at least {SOLVED:.0%} correct (greedy: "
        "its one answer); lost = solved in A and not in B, gained = the reverse, of seeds x "
        "problems.",
    ]


def terminal(result: CompareResult) -> str:
    """The comparison as a plain-text table, then what was not compared."""
    lines = [f"A = {result.a}: {result.sources[0]}", f"B = {result.b}: {result.sources[1]}",
             "differs: " + ("; ".join(result.differs) or "nothing on the command lines")]
    table = [list(COLUMNS), *(_cells(r) for r in result.rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in table]
    lines += [f"({line})" for line in how_to_read(result)]
    lines += [f"not compared: {u.what}: {u.reason}" for u in result.unpaired]
    lines += [f"unchanged: {u}" for u in result.unchanged]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def as_table(result: CompareResult) -> Table:
    """The rows as a report `Table` (section: the cell; row: agent and benchmark)."""
    table = Table("compare", f"B - A: {result.b} vs {result.a}", list(COLUMNS[3:]),
                  notes=how_to_read(result))
    for row in result.rows:
        table.add(row.group, f"{row.agent} · {row.benchmark}",
                  [Entry(text=t) for t in _cells(row)[3:]])
    return table


def to_frame(result: CompareResult) -> pd.DataFrame:
    """One line per test, numbers as fractions (comparison.csv)."""
    return pd.DataFrame.from_records([{
        "cell": r.group, "agent": r.agent, "benchmark": r.benchmark, "seeds": _seeds(r.seeds),
        "a": r.a.estimate, "a_lo": r.a.lo, "a_hi": r.a.hi, "b": r.b.estimate, "b_lo": r.b.lo,
        "b_hi": r.b.hi, "b_minus_a": r.diff.estimate, "lo": r.diff.lo, "hi": r.diff.hi,
        "se": r.diff.se, "df": r.diff.df, "p": r.diff.p, "p_holm": r.verdict.p_adjusted,
        "mde": r.verdict.mde, "verdict": r.outcome, "lost": r.lost, "gained": r.gained,
        "cases": r.cases, "a_runs": " ".join(r.runs_a), "b_runs": " ".join(r.runs_b)}
        for r in result.rows])


def _lists(result: CompareResult, tolerance: float | None) -> list[tuple[str, list[str]]]:
    out = [("Not compared", [f"{u.what}: {u.reason}" for u in result.unpaired]),
           ("Unchanged (not tested)", list(result.unchanged)), ("Notes", list(result.notes))]
    if tolerance is not None:
        out.append((f"Regressions beyond {tolerance:g} pt",
                    [regression_line(r) for r in result.regressions(tolerance)] or ["none"]))
    return out


def regression_line(row: Row) -> str:
    return (f"{row.label}: B - A {_diff(row.diff)} pt, p {_p(row.diff.p)} (Holm "
            f"{_p(row.verdict.p_adjusted)})")


def markdown(result: CompareResult, tolerance: float | None = None) -> str:
    parts = [f"# hacrl compare: {result.b} (B) vs {result.a} (A)", "",
             f"- A = `{result.a}`: {result.sources[0]}", f"- B = `{result.b}`: {result.sources[1]}",
             "- differs: " + ("; ".join(result.differs) or "nothing on the command lines"), "",
             as_table(result).to_markdown()]
    for title, items in _lists(result, tolerance):
        if items:
            parts += [f"## {title}", "", *(f"- {i}" for i in items), ""]
    return "\n".join(parts) + "\n"


def to_html(result: CompareResult, tolerance: float | None = None) -> str:
    from analysis.report import CSS

    title = f"hacrl compare: {result.b} (B) vs {result.a} (A)"
    head = "".join(f"<li>{html.escape(t)}</li>" for t in (
        f"A = {result.a}: {result.sources[0]}", f"B = {result.b}: {result.sources[1]}",
        "differs: " + ("; ".join(result.differs) or "nothing on the command lines")))
    lists = "".join(f"<h2>{html.escape(t)}</h2><ul>"
                    + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>"
                    for t, items in _lists(result, tolerance) if items)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<ul class="banner">{head}</ul>
<p class="notes">Generated {time.strftime('%Y-%m-%d %H:%M:%S')}.</p>
{as_table(result).to_html()}
{lists}
</body></html>
"""


def write(result: CompareResult, folder: Path, tolerance: float | None = None) -> Path:
    """The comparison's folder (index.html, report.md, comparison.csv), built aside and moved
    into place; a folder hacrl did not write is refused as `hacrl report` refuses it."""
    from analysis.report import MARKER, _swap_in, _tree, check_destination

    folder = folder.resolve()
    check_destination(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        (tmp / "report.md").write_text(markdown(result, tolerance))
        (tmp / "index.html").write_text(to_html(result, tolerance))
        to_frame(result).to_csv(tmp / "comparison.csv", index=False)
        note: dict[str, Any] = {"note": f"hacrl compare {result.a} {result.b}: the next "
                                "comparison replaces this folder as long as it holds only these "
                                "entries", "entries": sorted(_tree(tmp))}
        (tmp / MARKER).write_text(json.dumps(note))
        _swap_in(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder
