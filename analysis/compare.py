"""`hacrl compare A B`: did a change help or hurt, beyond the noise?

A and B are two sweeps' results, or one sweep's runs at two git commits (`analysis.compare_sides`
names the forms). The command line on top reads each side's manifest
(`hacrl.schema.sweep_manifest`) and opens its store (`analysis.store`); everything else happens
from those records and the runs' per-problem outcomes (`analysis.outcomes`), never from the
sweep's code: the cells of A and B are paired (`analysis.compare_pairing`), each side's run of a
cell's agent is picked (`analysis.compare_runs`), and here the outcomes are aligned and judged;
`analysis.compare_page` shows and writes the result.

Per group and agent, the seeds both sides ran with a finished, evaluated run are compared.
Whatever cannot be compared is listed with the reason: only in A or B (a whole cell or one
seed), no finished run, no per-problem outcomes logged, benchmarks or problems that differ. A
group whose runs are the very same runs in A and B (a single-agent baseline the changed key does
not reach, trained once for both sweeps) is listed as unchanged, not tested.

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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.compare_pairing import GroupKey, Unpaired, pair_cells
from analysis.compare_runs import PickedRuns, RunPicker
from analysis.compare_sides import CompareError, Side
from analysis.outcomes import OutcomesError, aligned_problem_means, read_outcomes
from analysis.stats import AVG, Difference, Estimate, cell_estimates, paired_difference
from analysis.verdicts import CONTRADICTED, SUPPORTED, Comparison, judge
from hacrl.schema.sweep_manifest import SweepManifest

REGRESSION_EXIT = 3          # --fail-on-regression found a significant regression
BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no difference inside the noise"
SOLVED = 0.5                 # a (seed, problem) is solved when this share of its samples is


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
    """A whole comparison: every test's row, what was not compared, and where the runs came
    from."""

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
    pickers = [RunPicker(side, store, protocol)
               for side, store in zip((a, b), stores, strict=True)]
    picked: dict[tuple[GroupKey, str], tuple[PickedRuns, PickedRuns]] = {}
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
            unchanged.append(f"{key.label}, {agent} (seeds {seed_list(common)}): the same runs "
                             "in A and B")
            continue
        scores = _aligned(outcomes[0].table, ids_a, outcomes[1].table, ids_b)
        if isinstance(scores, str):
            unpaired.append(Unpaired(f"{key.label} seeds {seed_list(common)}, {agent}", scores))
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


def _why(side: str, picked: PickedRuns, seed: int, missing: list[str]) -> str:
    if seed not in picked.runs:
        return f"no finished run in {side} ({picked.why.get(seed, 'not run')})"
    if picked.runs[seed] in missing:
        return f"no per-problem outcomes logged in {side} (run {picked.runs[seed]})"
    return ""


def seed_list(seeds: Iterable[int]) -> str:
    """Seeds as the tables name them: `0,1,2`."""
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


