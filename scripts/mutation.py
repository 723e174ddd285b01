"""Mutation testing of the modules where a silent bug changes results (docs/MUTATION.md).

    python scripts/mutation.py                      every group, then the table
    python scripts/mutation.py algo verifier        these groups only
    python scripts/mutation.py loop --survivors     re-check only the last run's survivors
    python scripts/mutation.py --report [--diffs]   the table (and survivors' diffs) only
    python scripts/mutation.py algo --fresh         forget the group's results and start over
    python scripts/mutation.py algo --sample 30     30 mutants a module: an estimate with interval
    python scripts/mutation.py --report --record    keep the table's complete rows in git

mutmut (pip install -e '.[mutation]') plants one change at a time ("mutant": `<` for `<=`,
`a - b` for `a + b`, a dropped argument, ...) in a group's modules and runs the group's tests
that reach the changed function; a mutant is killed when one of them fails and survives when
they all pass. Each group works in `.mutation/<group>/` (mutmut's copy of the packages, its
results and its map of which test reaches which function): a later run checks only mutants not
yet checked and those of functions that changed. Then it prints, per module and group:

    mutants | killed | timeout | equivalent | survived | no tests | unchecked | kill rate

kill rate = (killed + timeout) / (mutants - equivalent - unchecked). A mutant no test reaches
counts as a survivor. Equivalent mutants (no test can tell them from the original) are listed
with a reason each in scripts/mutation_equivalent.toml; an entry names the mutant and the line
it adds, so after its function changes it no longer matches and counts as a survivor again.
Exits 1 when a module of the chosen groups is below --goal (90%) or has unchecked mutants.
`--record` writes the rows of groups checked in full to scripts/mutation_record.json with the
commit and a digest of what they were measured on (modules, test files, equivalents); a group
with no results in `.mutation/` is reported from that record, marked stale once its modules,
tests or equivalents differ from what was measured.
Not part of CI: every group together is about an hour on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser from PyPI (the [mutation] extra)
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"
EQUIVALENT_FILE = ROOT / "scripts" / "mutation_equivalent.toml"
RECORD_FILE = ROOT / "scripts" / "mutation_record.json"


@dataclass(frozen=True)
class Group:
    modules: tuple[str, ...]  # files mutated
    tests: tuple[str, ...]  # test files run against them (the slow tier is left out)


_ALGO_TESTS = ("tests/test_algo_advantages.py", "tests/test_algo_capability.py",
               "tests/test_algo_edges.py", "tests/test_algo_plumbing.py",
               "tests/test_algo_loss.py", "tests/test_algo_methods.py",
               "tests/test_algo_objectives.py", "tests/test_algo_robustness.py",
               "tests/test_algo_theory.py", "tests/test_method_registry.py",
               "tests/test_as_run.py")
_LOOP_TESTS = ("tests/test_loop.py", "tests/test_loop_glue.py", "tests/test_method_registry.py",
               "tests/test_job.py")

GROUPS: dict[str, Group] = {
    "algo": Group(("hacrl/algo/advantages.py", "hacrl/algo/capability.py", "hacrl/algo/loss.py",
                   "hacrl/algo/loss_inputs.py", "hacrl/algo/methods.py",
                   "hacrl/algo/metrics.py", "hacrl/algo/objectives.py",
                   "hacrl/algo/ratios.py", "hacrl/algo/registry.py"), _ALGO_TESTS),
    "loop": Group(("hacrl/training/loop.py",), _LOOP_TESTS),
    "settings": Group(("hacrl/config/settings.py",), _LOOP_TESTS),
    "state": Group(("hacrl/sweep/state.py",),
                   ("tests/test_progress.py", "tests/test_fileio.py", "tests/test_faults.py",
                    "tests/test_zoo_draws.py", "tests/test_sweep.py", "tests/test_sweep_state.py",
                    "tests/test_relocate.py")),
    "verifier": Group(("hacrl/verify/__init__.py", "hacrl/verify/equivalence.py",
                       "hacrl/verify/extract.py", "hacrl/verify/normalize.py"),
                      ("tests/test_verify.py", "tests/test_verify_pool.py", "tests/test_arith_task.py")),
    "stats": Group(("analysis/stats.py",),
                   ("tests/test_stats.py", "tests/test_stats_exact.py", "tests/test_verdicts.py",
                    "tests/test_claims.py", "tests/test_analysis.py")),
    # the predicted cost: a cell's work, the fit, the sweep's wall time, the calibrations
    "cost_model": Group(("hacrl/sweep/cost_model.py", "hacrl/sweep/cost_plan.py"),
                        ("tests/test_cost_model.py",)),
    "verdicts": Group(("analysis/verdicts.py",),
                      ("tests/test_verdicts.py", "tests/test_claims.py", "tests/test_stats.py",
                       "tests/test_analysis.py")),
    "verl": Group(("hacrl/engines/verl/batch.py", "hacrl/engines/verl/worker_loss.py"),
                  ("tests/test_verl_engine.py",)),
    # the multi-node path: SLURM's allocation -> the Ray plan -> the `ray start` nodes -> the
    # job's connection, and a lost worker as one EngineError (their fast tests; the two-node
    # jobs themselves are cluster tests)
    "ray": Group(("hacrl/engines/verl/slurm_allocation.py", "hacrl/engines/verl/ray_plan.py",
                  "hacrl/engines/verl/ray_nodes.py", "hacrl/engines/verl/ray_cluster.py"),
                 ("tests/test_verl_ray_cluster.py",)),
}

def _mutmut() -> str | None:
    """The mutmut next to this Python (a venv not activated), else the one on PATH."""
    beside = Path(sys.executable).parent / "mutmut"
    return str(beside) if beside.is_file() else shutil.which("mutmut")


KILLED = {1, 3}  # a test failed (3: pytest's internal error, also a failure)
TIMEOUT = {36, -24, 24, 152, 255}  # the tests did not end in time: the mutant is detected
NO_TESTS = {5, 33}  # no selected test reaches the mutated function
LINKED = ("hacrl", "analysis", "hydra_plugins", "tests", "experiments", "sweeps")


# --- running ---------------------------------------------------------------------------------

def prepare(name: str, group: Group) -> Path:
    """`.mutation/<name>/`: links to the sources and tests, and a pyproject.toml with the group's
    mutmut settings. Stale copies of unmutated files are dropped so mutmut copies them afresh."""
    work = WORK / name
    work.mkdir(parents=True, exist_ok=True)
    for entry in LINKED:
        link = work / entry
        if not link.is_symlink():
            link.symlink_to(ROOT / entry)
    project = (ROOT / "pyproject.toml").read_text()
    tests = [t for t in group.tests if (ROOT / t).is_file()]
    settings = {
        "source_paths": ["hacrl", "analysis"],
        # experiments/ and sweeps/ are links into hacrl/conf (made below), as in the repository
        "also_copy": ["hydra_plugins"],
        "only_mutate": list(group.modules),
        # each mutant reruns the tests that reach it: the slow tier (whole jobs, sweeps) is
        # left out, and those tests run in this process or start their own (PYTHONPATH below)
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-p", "no:randomly", "-m", "not slow"],
        "pytest_add_cli_args_test_selection": tests,
        # forked from a process that has run no torch op: a forked OpenMP pool can hang
        "process_isolation": "forkserver",
    }
    (work / "pyproject.toml").write_text(project + "\n[tool.mutmut]\n" + "".join(
        f"{key} = {json.dumps(value)}\n" for key, value in settings.items()))
    # A process the tests start (a verifier worker, a job) imports the mutated copy too; while
    # mutmut maps tests to functions (MUTANT_UNDER_TEST=stats) its trampolines read mutmut's
    # settings from the working directory, which such a process may not share (a test's tmp
    # folder): this hook reads them from the group's folder at interpreter start.
    boot = work / "boot"
    boot.mkdir(exist_ok=True)
    (boot / "sitecustomize.py").write_text(_BOOT_HOOK)
    copies = work / "mutants"
    # made now: a PYTHONPATH entry missing when mutmut starts is cached as "nothing there" by
    # the import system, and the tests would then import the unmutated package
    copies.mkdir(exist_ok=True)
    for name, target in (("experiments", "hacrl/conf"), ("sweeps", "hacrl/conf/sweep")):
        link = copies / name
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)  # a copy made by an earlier version of this script
        if not link.is_symlink():
            link.symlink_to(target)
    if copies.is_dir():
        mutated = {str(copies / m) for m in group.modules}
        for path in copies.rglob("*"):
            if path.is_file() and path.suffix in {".py", ".yaml", ".md", ".json", ".csv"} \
                    and str(path) not in mutated and path.name != "mutmut-stats.json":
                path.unlink()
    return work


_BOOT_HOOK = """\
import os

if os.environ.get("MUTANT_UNDER_TEST") == "stats" and os.environ.get("MUTMUT_HACRL_GROUP_DIR"):
    _here = os.getcwd()
    try:
        os.chdir(os.environ["MUTMUT_HACRL_GROUP_DIR"])
        from mutmut.configuration import config
        config()  # loaded once, from the group's pyproject.toml, and kept for this process
    finally:
        os.chdir(_here)
"""


PROGRESS = re.compile(r"(\d+)/(\d+)\s+🎉 (\d+) 🫥 (\d+)\s+⏰ (\d+)\s+🤔 (\d+)\s+🙁 (\d+)")


def run_group(name: str, group: Group, jobs: int, names: list[str]) -> int:
    """mutmut over one group, its progress as one line every 15 s."""
    work = prepare(name, group)
    # what these results are measured on: --record refuses them once the sources changed
    (work / "measured.json").write_text(json.dumps({"sources": sources_digest(name),
                                                    "commit": _commit()}))
    env = dict(os.environ, PYTHONPATH=f"{work / 'mutants'}:{work / 'boot'}" + (
        f":{os.environ['PYTHONPATH']}" if os.environ.get("PYTHONPATH") else ""),
        OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1", HACRL_TEST_MICRO_ZOO_CACHE=str(WORK / "micro_zoo"),
        MUTMUT_HACRL_GROUP_DIR=str(work))
    # HACRL_TEST_MICRO_ZOO_CACHE: the micro zoo is built once for all mutants (tests/conftest.py),
    # not once per mutant (~6 s each). PYTHONPATH: processes the tests start import the mutated copy too (an editable install's
    # finder comes after sys.path)
    cmd = [_mutmut() or "mutmut", "run", "--max-children", str(jobs), *names]
    print(f"[mutation] {name}: {' '.join(group.modules)}", flush=True)
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    last, buffer = 0.0, ""
    tail: list[str] = []
    start = time.monotonic()
    while chunk := proc.stdout.read(256):
        buffer += chunk
        *lines, buffer = re.split(r"[\r\n]", buffer)
        for line in lines:
            m = PROGRESS.search(line)
            if m and time.monotonic() - last >= 15:
                done, total, killed, no_tests, timeout, suspicious, survived = m.groups()
                print(f"[mutation] {name}: {done}/{total} checked, {killed} killed, "
                      f"{survived} survived, {no_tests} no tests, {timeout} timeout "
                      f"({time.monotonic() - start:.0f} s)", flush=True)
                last = time.monotonic()
            elif line.strip() and not m and not re.search("[\u2800-\u28ff]", line):
                tail = (tail + [line])[-40:]
    code = proc.wait()
    if code:
        print(f"[mutation] {name}: mutmut exited {code}; its last lines:", *tail, sep="\n  ",
              file=sys.stderr)
    return code


# --- reporting -------------------------------------------------------------------------------

@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    survivors: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.counts.update(other.counts)
        self.survivors += other.survivors

    @property
    def checked(self) -> int:
        c = self.counts
        return c["mutants"] - c["equivalent"] - c["unchecked"]

    @property
    def rate(self) -> float | None:
        c = self.counts
        return (c["killed"] + c["timeout"]) / self.checked if self.checked else None


def load_equivalent() -> dict[str, dict[str, str]]:
    """{mutant name: {"line": the line the mutant adds, "reason": why no test can tell}}."""
    path = EQUIVALENT_FILE
    if not path.is_file():
        return {}
    entries = tomllib.loads(path.read_text())
    for name, entry in entries.items():
        if not isinstance(entry, dict) or not {"line", "reason"} <= entry.keys():
            raise SystemExit(f"{path}: [{name!r}] needs a 'line' and a 'reason'")
    return entries


def mutant_diff(work: Path, name: str, module: str) -> str:
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    cwd = Path.cwd()
    os.chdir(work)  # mutmut reads its copies relative to the working directory
    try:
        return get_diff_for_mutant(name, path=module)
    finally:
        os.chdir(cwd)


def added_line(work: Path, name: str, module: str) -> str | None:
    for line in mutant_diff(work, name, module).splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            return line[1:].strip()
    return None


def tally(work: Path, module: str, equivalent: dict[str, dict[str, str]]) -> Tally | None:
    meta = work / "mutants" / f"{module}.meta"
    if not meta.is_file():
        return None
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    t = Tally()
    for name, code in sorted(codes.items()):
        t.counts["mutants"] += 1
        if code in KILLED:
            t.counts["killed"] += 1
        elif code in TIMEOUT:
            t.counts["timeout"] += 1
        elif code is None:
            t.counts["unchecked"] += 1
        elif name in equivalent and \
                added_line(work, name, module) == equivalent[name]["line"].strip():
            t.counts["equivalent"] += 1
        elif code in NO_TESTS:
            t.counts["no tests"] += 1
            t.survivors.append(name)
        else:  # survived, or what mutmut calls suspicious or a segfault: not a detection
            t.counts["survived"] += 1
            t.survivors.append(name)
    return t


def _row(label: str, t: Tally) -> str:
    c = t.counts
    rate = "-" if t.rate is None else f"{100 * t.rate:.1f}%"
    if c["unchecked"] and t.checked:  # a sample: how far its rate may be from the module's
        low, high = wilson(c["killed"] + c["timeout"], t.checked)
        rate += f" [{100 * low:.0f}, {100 * high:.0f}] of {t.checked}"
    return (f"| {label} | {c['mutants']} | {c['killed']} | {c['timeout']} | {c['equivalent']} "
            f"| {c['survived']} | {c['no tests']} | {c['unchecked']} | {rate} |")


def sources_digest(name: str) -> str:
    """The group's modules and test files as they are now."""
    group, h = GROUPS[name], hashlib.sha256()
    for path in (*group.modules, *group.tests):
        h.update(path.encode() + b"\0")
        h.update((ROOT / path).read_bytes() if (ROOT / path).is_file() else b"<missing>")
    return h.hexdigest()[:16]


def digest(name: str, equivalent: dict[str, dict[str, str]]) -> str:
    """What a group's results depend on: its modules, its test files and its modules'
    equivalent entries (a change to any of them can change a mutant's fate)."""
    group, h = GROUPS[name], hashlib.sha256()
    for path in (*group.modules, *group.tests):
        h.update(path.encode() + b"\0")
        h.update((ROOT / path).read_bytes() if (ROOT / path).is_file() else b"<missing>")
    dotted = tuple(m.removesuffix(".py").removesuffix("/__init__").replace("/", ".") + "."
                   for m in group.modules)
    for key in sorted(k for k in equivalent if k.startswith(dotted)):
        h.update(json.dumps([key, equivalent[key]["line"]]).encode())
    return h.hexdigest()[:16]


def _measured(work: Path) -> dict[str, str]:
    """The sources digest and commit a group's run started from ({}: unknown)."""
    try:
        data = json.loads((work / "measured.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_record() -> dict[str, dict]:
    return json.loads(RECORD_FILE.read_text()) if RECORD_FILE.is_file() else {}


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return (out.stdout.strip() or "unknown") + ("+changes" if dirty else "")


def report(groups: list[str], goal: float, diffs: bool, markdown: Path | None,
           record: bool = False) -> int:
    equivalent = load_equivalent()
    recorded = load_record()
    notes: list[str] = []
    lines = ["| group: module | mutants | killed | timeout | equivalent | survived | no tests "
             "| unchecked | kill rate |", "|---|---|---|---|---|---|---|---|---|"]
    below: list[str] = []
    everything = Tally()
    survivors: list[tuple[Path, str, str]] = []
    for name in groups:
        work, whole = WORK / name, Tally()
        live = {m: tally(work, m, equivalent) for m in GROUPS[name].modules}
        kept = recorded.get(name)
        from_record = all(t is None for t in live.values()) and kept is not None
        if from_record:
            assert kept is not None
            stale = kept["digest"] != digest(name, equivalent)
            notes.append(f"{name}: recorded at {kept['commit']} ({kept['date']})"
                         + (", STALE: its modules, tests or equivalents changed since"
                            if stale else ""))
            for m in GROUPS[name].modules:
                row = kept["modules"].get(m)
                if row is not None:
                    live[m] = Tally(Counter(row["counts"]), list(row["survivors"]))
            if stale:
                below.append(f"{name}: its record is stale (python scripts/mutation.py {name})")
        for module in GROUPS[name].modules:
            t = live[module]
            if t is None:
                lines.append(f"| {name}: {module} | not run | | | | | | | |")
                below.append(f"{module}: not run (python scripts/mutation.py {name})")
                continue
            lines.append(_row(f"{name}: {module}", t))
            whole.add(t)
            if not from_record:
                survivors += [(work, s, module) for s in t.survivors]
            if t.counts["unchecked"]:
                below.append(f"{module}: {t.counts['unchecked']} mutants not checked")
            elif t.rate is not None and t.rate < goal:
                below.append(f"{module}: {100 * t.rate:.1f}% killed, under {100 * goal:.0f}%")
        if len(GROUPS[name].modules) > 1:
            lines.append(_row(f"**{name}**", whole))
        everything.add(whole)
        complete = not from_record and all(t is not None and not t.counts["unchecked"]
                                           for t in live.values())
        measured = _measured(work)
        if record and complete and measured.get("sources") != sources_digest(name):
            notes.append(f"{name}: not recorded: its modules or tests changed since they were "
                         f"checked (python scripts/mutation.py {name})")
        elif record and complete:
            recorded[name] = {
                "commit": measured.get("commit", _commit()), "date": time.strftime("%Y-%m-%d"),
                "digest": digest(name, equivalent),
                "modules": {m: {"counts": dict(t.counts), "survivors": t.survivors}
                            for m, t in live.items() if t is not None}}
            notes.append(f"{name}: recorded in {RECORD_FILE.relative_to(ROOT)}")
        elif record and not from_record:
            notes.append(f"{name}: not recorded (not checked in full)")
    if len(groups) > 1:
        lines.append(_row("**all**", everything))
    table = "\n".join(lines)
    print(table)
    if record:
        RECORD_FILE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    for note in notes:
        print(f"[mutation] {note}")
    if markdown:
        markdown.write_text(table + "\n")
    if diffs:
        for work, s, module in survivors:
            print(f"\n# {s}\n{mutant_diff(work, s, module)}")
    elif survivors:
        print(f"\n{len(survivors)} survivors (--diffs shows them): "
              + ", ".join(s for _, s, _ in survivors[:30]) + (" ..." if len(survivors) > 30 else ""))
    for line in below:
        print(f"below the goal: {line}")
    return 1 if below else 0


def survivors_of(name: str) -> list[str]:
    work = WORK / name
    found = []
    for module in GROUPS[name].modules:
        meta = work / "mutants" / f"{module}.meta"
        if meta.is_file():
            codes = json.loads(meta.read_text())["exit_code_by_key"]
            found += [k for k, v in codes.items() if v is not None and v not in KILLED | TIMEOUT]
    return found


_NAME_MUTANTS = """\
import json, sys
from mutmut.mutation.file_mutation import mutate_file_contents
print(json.dumps({m: list(mutate_file_contents(m, open(m).read()).mutant_names) for m in sys.argv[1:]}))
"""


def sample_of(name: str, group: Group, k: int) -> list[str]:
    """k mutants of each module of the group, drawn with a fixed seed from every mutant mutmut's
    generator makes of it: a quick estimate (e.g. of the suite at an old commit)."""
    work = prepare(name, group)
    out = subprocess.run([sys.executable, "-c", _NAME_MUTANTS, *group.modules], cwd=work,
                         capture_output=True, text=True, check=True).stdout
    chosen = []
    for module, names in json.loads(out).items():
        dotted = module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        chosen += [f"{dotted}.{n}" for n in random.Random(module).sample(names, min(k, len(names)))]
    return chosen


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of a proportion hits/n (stays inside [0, 1] for a small sample)."""
    p = hits / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("groups", nargs="*", metavar="GROUP",
                        help=f"groups to run: {', '.join(GROUPS)} (all by default)")
    parser.add_argument("--report", action="store_true", help="print the table; run nothing")
    parser.add_argument("--diffs", action="store_true", help="print each survivor's diff")
    parser.add_argument("--survivors", action="store_true",
                        help="re-check only the mutants that survived the last run")
    parser.add_argument("--fresh", action="store_true", help="forget the groups' results")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2,
                        help="mutants checked at once")
    parser.add_argument("--sample", type=int, metavar="K",
                        help="check only K mutants of each module, drawn with a fixed seed; "
                             "the table gives their kill rate with a 95%% interval")
    parser.add_argument("--goal", type=float, default=0.90, help="kill rate each module needs")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--record", action="store_true",
                        help=f"keep the rows of groups checked in full in {RECORD_FILE.name}")
    args = parser.parse_args(argv)
    if args.sample is not None and (args.sample < 1 or args.survivors):
        parser.error("--sample K needs K >= 1 and goes without --survivors")
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        parser.error(f"unknown group {', '.join(unknown)}; the groups: {', '.join(GROUPS)}")
    groups = args.groups or list(GROUPS)
    if not args.report:
        if _mutmut() is None:
            print("mutation: mutmut is not installed: pip install -e '.[mutation]'",
                  file=sys.stderr)
            return 2
        for name in groups:
            if args.fresh:
                shutil.rmtree(WORK / name / "mutants", ignore_errors=True)
            names = survivors_of(name) if args.survivors else \
                sample_of(name, GROUPS[name], args.sample) if args.sample else []
            if args.survivors and not names:
                print(f"[mutation] {name}: no survivors to re-check")
                continue
            if run_group(name, GROUPS[name], args.jobs, names):
                return 2
    return report(groups, args.goal, args.diffs, args.markdown, args.record)


if __name__ == "__main__":
    sys.exit(main())
