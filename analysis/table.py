"""A reproduced table: every cell ours next to the paper's, rendered as Markdown, LaTeX, CSV and
HTML. A cell without a value says why (not run, running, failed, ...) instead of vanishing."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import pandas as pd

from analysis.cell_values import Value


@dataclass
class Entry:
    """One cell: our value(s), the paper's, and how to show them."""

    ours: Value | None = None         # None: the paper has this cell, we have nothing to show
    paper: float | None = None
    digits: int = 3
    compare: bool = True              # show ours - paper (False when the units differ)
    paper_note: str = ""              # e.g. the AVG the paper printed, when it differs
    paper_extra: str = ""             # the paper's own difference to a baseline, in brackets
    extra: str = ""                   # e.g. the difference to GSPOx2, in brackets
    text: str | None = None           # a plain text cell (e.g. a hyperparameter)
    # 95% interval of ours from the per-problem outcomes (analysis.stats: problems and seeds);
    # None: no samples to compute one from (see `uncertainty`)
    interval: tuple[float, float] | None = None
    uncertainty: str = ""             # why there is no interval, e.g. "no samples"

    @property
    def delta(self) -> float | None:
        if not self.compare or self.paper is None or self.ours is None or self.ours.mean is None:
            return None
        return self.ours.mean - self.paper

    def ours_text(self) -> str:
        if self.text is not None:
            return self.text
        if self.ours is None:
            return ""
        if self.ours.mean is None:
            return f"— ({self.ours.reason or 'not run'})"
        out = f"{self.ours.mean:.{self.digits}f}"
        if self.interval is not None:
            lo, hi = self.interval
            out += f" [{lo:.{self.digits}f}, {hi:.{self.digits}f}]"
            if self.ours.n > 1:
                out += f" (n={self.ours.n})"
        elif self.ours.n > 1:
            std = self.ours.std
            out += f" ± {std:.{self.digits}f} (n={self.ours.n})" if std is not None else ""
        if self.interval is None and self.uncertainty:
            out += f" ({self.uncertainty})"
        if self.ours.reason:  # some seeds missing
            out += f" [{self.ours.reason}]"
        return out + (f" {self.extra}" if self.extra else "")

    def paper_text(self) -> str:
        if self.paper is None:  # a note still says why (e.g. "no samples")
            return f"paper: {self.paper_note}" if self.paper_note else ""
        out = f"paper {self.paper:.{self.digits}f}"
        if self.paper_extra:
            out += f" {self.paper_extra}"
        if self.paper_note:
            out += f" ({self.paper_note})"
        if self.delta is not None:
            out += f", Δ {self.delta:+.{self.digits}f}"
        return out


@dataclass
class Table:
    key: str                 # file stem, e.g. "table1"
    title: str
    columns: list[str]
    rows: list[tuple[str, str, list[Entry]]] = field(default_factory=list)  # (section, row, cells)
    notes: list[str] = field(default_factory=list)

    def add(self, section: str, row: str, entries: list[Entry]) -> None:
        assert len(entries) == len(self.columns), (self.key, row)
        self.rows.append((section, row, entries))

    def run_ids(self) -> list[tuple[str, str, str, list[str]]]:
        return [(s, r, c, e.ours.run_ids) for s, r, es in self.rows
                for c, e in zip(self.columns, es, strict=True) if e.ours and e.ours.run_ids]

    # -- renderers ---------------------------------------------------------------------------
    def to_frame(self) -> pd.DataFrame:
        """Long format: one line per cell with numbers, the paper's value, delta and reason."""
        records = []
        for section, row, entries in self.rows:
            for column, e in zip(self.columns, entries, strict=True):
                ours = e.ours
                records.append({
                    "section": section, "row": row, "column": column,
                    "ours": ours.mean if ours else None, "ours_std": ours.std if ours else None,
                    "ours_lo": e.interval[0] if e.interval else None,
                    "ours_hi": e.interval[1] if e.interval else None,
                    "n": ours.n if ours else 0, "paper": e.paper, "delta": e.delta,
                    "text": e.text, "missing": ours.reason if ours and ours.mean is None else "",
                    "run_ids": " ".join(ours.run_ids) if ours else ""})
        return pd.DataFrame.from_records(records)

    def to_markdown(self) -> str:
        head = ["", "", *self.columns]
        lines = [f"### {self.title}", "", "| " + " | ".join(head) + " |",
                 "|" + "---|" * len(head)]
        for section, row, entries in self.rows:
            cells = []
            for e in entries:
                parts = [p for p in (e.ours_text(), e.paper_text()) if p]
                cells.append("<br>".join(p.replace("|", "\\|") for p in parts))
            lines.append(f"| {section} | {row} | " + " | ".join(cells) + " |")
        lines += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def to_latex(self) -> str:
        def esc(s: str) -> str:
            for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"),
                         ("#", r"\#"), ("±", r"$\pm$"), ("Δ", r"$\Delta$"), ("—", "--")):
                s = s.replace(a, b)
            return s

        spec = "ll" + "c" * len(self.columns)
        out = [r"\begin{table}[t]", r"\centering", r"\scriptsize", rf"\caption{{{esc(self.title)}}}",
               rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
               " & ".join(["", "", *map(esc, self.columns)]) + r" \\", r"\midrule"]
        for section, row, entries in self.rows:
            cells = [esc(" / ".join(p for p in (e.ours_text(), e.paper_text()) if p))
                     for e in entries]
            out.append(" & ".join([esc(section), esc(row), *cells]) + r" \\")
        out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
        return "\n".join(out) + "\n"

    def to_html(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in ["", "", *self.columns])
        body = []
        for section, row, entries in self.rows:
            cells = []
            for e in entries:
                missing = e.ours is not None and e.ours.mean is None and e.text is None
                ids = " ".join(e.ours.run_ids) if e.ours else ""
                title = f' title="MLflow runs: {html.escape(ids)}"' if ids else ""
                cls = ' class="missing"' if missing else ""
                paper = (f'<br><span class="paper">{html.escape(e.paper_text())}</span>'
                         if e.paper_text() else "")
                cells.append(f"<td{cls}{title}>{html.escape(e.ours_text())}{paper}</td>")
            body.append(f"<tr><th>{html.escape(section)}</th><th>{html.escape(row)}</th>"
                        + "".join(cells) + "</tr>")
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return (f'<h3 id="{self.key}">{html.escape(self.title)}</h3>\n<table>'
                f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>\n"
                + (f"<ul class='notes'>{notes}</ul>\n" if notes else ""))
