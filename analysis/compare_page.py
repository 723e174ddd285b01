"""What `hacrl compare` shows and writes: the terminal table, and the comparison's folder
(`write`: index.html, report.md, comparison.csv) built from an `analysis.compare.CompareResult`.
"""

from __future__ import annotations

import html
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.compare import NO_DIFFERENCE, SOLVED, CompareResult, Row, seed_list
from analysis.stats import Difference, Estimate
from analysis.table import Entry, Table

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
    return [row.group, row.agent, row.benchmark, seed_list(row.seeds), _acc(row.a), _acc(row.b),
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
        "cell": r.group, "agent": r.agent, "benchmark": r.benchmark, "seeds": seed_list(r.seeds),
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
