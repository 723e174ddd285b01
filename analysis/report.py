"""`hacrl report <sweep>`: every table and figure of a sweep, next to the paper's numbers.

Writes <output_root>/reports/<sweep>-<scale>/ (built in a temporary folder, then moved into
place: a report is never half-written). A folder is only ever replaced if hacrl wrote it (it
holds MARKER); any other existing, non-empty folder is refused before anything is written:
    index.html               everything: claims, tables, figures, the MLflow runs behind each cell
    report.md                the same in Markdown
    tables/<key>.{md,tex,csv}   the sweep's tables, and `cost` (what its cells cost, measured)
    figures/<name>.{png,svg}
    runs.csv                 table, section, row, column -> MLflow run ids
    .hacrl-report            the marker: this folder is a report hacrl may replace
and logs the folder as artifacts of an MLflow run (tags hacrl.kind=report, sweep, scale), so it
can be browsed in the MLflow UI next to the runs it summarises.

What it reads: the store, and the sweep's record (`hacrl.schema.sweep_manifest.SweepManifest`:
cells, the tables and figures the sweep names, the sweeps' grids), which the command on top
hands in (`hacrl.cli.sweep_report`); never the sweep's code. The tables and figures are the
builders registered under those keys (`analysis.table_registry`).
"""

from __future__ import annotations

import html
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from analysis import claims as claims_mod
from analysis.builders import registered, unknown_keys
from analysis.context import Context
from analysis.cost import cost_table
from analysis.store import Store
from analysis.table import Table
from analysis.table_registry import figure_order, table_order
from hacrl.core.errors import ConfigError, OutputError, StoreError
from hacrl.core.layout import Layout
from hacrl.schema import tags as T
from hacrl.schema.sweep_manifest import SweepManifest

MARKER = ".hacrl-report"
COST = "cost"  # the measured-cost table every report ends with (`analysis.cost`)


@dataclass
class Report:
    folder: Path
    tables: dict[str, Table]
    figures: list[str]
    claims: list[claims_mod.Claim]
    run_id: str | None
    seconds: float
    runs_read: int = 0
    store: str = ""
    undrawn: list[str] = field(default_factory=list)


@dataclass
class Destination:
    """Where a report goes and the store it reads (checked before any cell is looked at)."""

    folder: Path
    store: Store
    scale: str


def destination(sweep: str, cfg: DictConfig, folder: Path | None = None,
                require_runs: bool = False) -> Destination:
    """The report folder of `sweep` (refused if hacrl did not write it) and the open store,
    at the scale, output root and store of the composed config `cfg`. `require_runs`: a store
    without runs is an error (a user asking for a report of nothing)."""
    from analysis.store import open_store
    from hacrl.tracking.mlflow_store import resolve_uri

    root = Layout.at(cfg.output_root)
    folder = (folder or root.report(sweep, str(cfg.scale.name))).resolve()
    check_destination(folder)
    store = open_store(resolve_uri(cfg.tracking.uri, root.root), str(cfg.tracking.experiment))
    if require_runs and store.runs.empty:
        raise StoreError(f"no runs in {store.uri} (experiment {store.experiment}): nothing to "
                         f"report; run `hacrl sweep {sweep}` first, or pass output_root=... or "
                         "tracking.uri=... where it ran")
    return Destination(folder, store, str(cfg.scale.name))


def make_report(manifest: SweepManifest, cfg: DictConfig | None = None, log: bool = True,
                where: Destination | None = None) -> Report:
    """The report of the sweep `manifest` records (its cells, the tables and figures it names,
    the sweeps' grids), written to `where` (default: `destination` of `cfg`)."""
    if where is None:
        assert cfg is not None, "make_report: give the composed config or a destination"
        where = destination(manifest.sweep, cfg)
    if manifest.pairs is None or manifest.methods is None:
        raise ValueError(f"the manifest of sweep {manifest.sweep} records no pairs and methods "
                         f"(written by an older hacrl); `hacrl report {manifest.sweep}` records them")
    ctx = Context(where.store, manifest.cells, where.scale, manifest.grids or {},
                  pairs=manifest.pairs, methods=manifest.methods)
    return build(ctx, manifest.sweep, where.folder, manifest.tables or [],
                 manifest.figures or [], log=log)


def check_destination(folder: Path) -> None:
    """Refuse (OutputError, nothing written) a destination hacrl did not create."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise OutputError(f"report folder {folder} exists and is not a folder; choose another "
                          "--out")
    if folder.is_dir() and any(folder.iterdir()) and not _ours(folder):
        raise OutputError(f"report folder {folder} exists and holds files hacrl report did not "
                          f"write (see {MARKER}); nothing was changed: choose a new or empty "
                          "--out, or remove it yourself")


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.name != MARKER}


def _ours(folder: Path) -> bool:
    """A folder hacrl report wrote and nobody added to since: its marker lists every file and
    folder the report made, and nothing else is there (a user's `.git`, notes, ...)."""
    try:
        made = set(json.loads((folder / MARKER).read_text())["entries"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return _tree(folder) <= made


def _swap_in(tmp: Path, folder: Path) -> None:
    """Put the finished report `tmp` at `folder`: the old report (ours) goes only after."""
    check_destination(folder)  # again: it may have changed while the report was built
    if not folder.exists():
        tmp.rename(folder)
        return
    if not any(folder.iterdir()):  # an empty folder the user made (maybe their cwd): fill it
        for item in tmp.iterdir():
            item.rename(folder / item.name)
        tmp.rmdir()
        return
    old = folder.with_name(f".{folder.name}.old-{tmp.name}")
    folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def build(ctx: Context, sweep: str, folder: Path, table_keys: list[str],
          figure_keys: list[str], log: bool = True) -> Report:
    """Write the report of `sweep` with these tables and figures (registry keys) into
    `folder`, and log it to MLflow (`log`)."""
    started = time.perf_counter()
    if unknown := unknown_keys(table_keys, figure_keys):
        kind, key, choices = unknown[0]
        raise ConfigError(f"sweep {sweep}: report {kind} {key!r} is not registered; choose from "
                          f"{', '.join(choices)}")
    builders, _ = registered()
    tables = {key: builders[key](ctx) for key in table_order(table_keys)}
    tables[COST] = cost_table(ctx)  # every report: what its cells cost, measured
    found_claims = claims_mod.check(tables, ctx)
    folder = folder.resolve()
    check_destination(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        (tmp / "tables").mkdir()
        (tmp / "figures").mkdir()
        for key, table in tables.items():
            (tmp / "tables" / f"{key}.md").write_text(table.to_markdown())
            (tmp / "tables" / f"{key}.tex").write_text(table.to_latex())
            table.to_frame().to_csv(tmp / "tables" / f"{key}.csv", index=False)
        figures, undrawn = _figures(ctx, figure_keys, tmp / "figures")
        runs = [{"table": key, "section": s, "row": r, "column": c, "run_ids": " ".join(ids)}
                for key, t in tables.items() for s, r, c, ids in t.run_ids()]
        pd.DataFrame(runs, columns=["table", "section", "row", "column", "run_ids"]).to_csv(
            tmp / "runs.csv", index=False)
        title = f"hacrl report: sweep `{sweep}`, {ctx.scale_note}"
        (tmp / "report.md").write_text(_markdown(title, tables, figures, undrawn, found_claims))
        (tmp / "index.html").write_text(_html(title, ctx, tables, figures, undrawn,
                                              found_claims))
        (tmp / MARKER).write_text(json.dumps({
            "note": f"hacrl report of sweep {sweep}: the next report replaces this folder as "
                    "long as it holds only these entries", "entries": sorted(_tree(tmp))}))
        _swap_in(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    run_id = None
    if log:
        try:
            run_id = _log(ctx, sweep, folder)
        except StoreError as err:  # e.g. a read-only archived store: the report is still there
            print(f"hacrl: warning: report written to {folder}, not logged to MLflow: {err}",
                  file=sys.stderr, flush=True)
    return Report(folder, tables, figures, found_claims, run_id, time.perf_counter() - started,
                  len(ctx.store.runs), ctx.store.uri, undrawn)


def _figures(ctx: Context, keys: list[str], folder: Path) -> tuple[list[str], list[str]]:
    """Figures drawn, and those with nothing to draw yet."""
    import matplotlib.pyplot as plt

    _, builders = registered()
    made, undrawn = [], []
    for name in figure_order(keys):
        fig = builders[name](ctx)
        if fig is None:
            undrawn.append(name)
            continue
        fig.savefig(folder / f"{name}.png", dpi=110)
        fig.savefig(folder / f"{name}.svg")
        plt.close(fig)
        made.append(name)
    return made, undrawn


def _log(ctx: Context, sweep: str, folder: Path) -> str:
    from hacrl.tracking import Tracker

    tracker = Tracker(ctx.store.uri, ctx.store.experiment)
    run_id = tracker.start_run(f"report:{sweep}:{ctx.scale}", {
        T.KIND: T.REPORT, T.SWEEP: sweep, T.SCALE: ctx.scale, T.REPORT_DIR: str(folder)})
    try:
        tracker.log_artifacts(run_id, folder, "report")
    finally:
        tracker.finish(run_id)
    return run_id


def _claims_lines(found: list[claims_mod.Claim]) -> list[str]:
    lines = []
    for c in found:
        how = f" ({c.method})" if c.method else ""
        paper = f" — paper's own numbers: {c.paper_verdict}" if c.paper_verdict else ""
        lines.append(f"- **{c.text}**: {c.verdict}{how}{paper}")
        lines += [f"  - {d}" for d in c.details]
    return lines


UNDRAWN = "no run of its cells has logged the curve or value yet"


def _markdown(title: str, tables: dict[str, Table], figures: list[str], undrawn: list[str],
              found: list[claims_mod.Claim]) -> str:
    parts = [f"# {title}", "", "## Claims", "", *_claims_lines(found), ""]
    parts += [t.to_markdown() for t in tables.values()]
    parts += ["## Figures", ""] + [f"![{f}](figures/{f}.png)" for f in figures]
    parts += [f"- {f}: not drawn ({UNDRAWN})" for f in undrawn]
    return "\n".join(parts) + "\n"


CSS = """body{font-family:sans-serif;margin:1.5em;max-width:1500px}
table{border-collapse:collapse;font-size:12px;margin-bottom:.5em}
td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
td.missing{color:#999;background:#f6f6f6}.paper{color:#666;font-size:11px}
.banner{background:#fff3cd;padding:.6em;border:1px solid #e0c060}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}.notes{font-size:12px;color:#444}"""
# Sets data-images on <body> to "<loaded>/<total>" once the page has loaded: a headless browser
# reading the DOM (scripts/check_report_html.py) sees whether every image rendered.
IMAGE_CHECK = """<script>window.addEventListener('load',function(){var i=document.images,n=0;
for(var k=0;k<i.length;k++){if(i[k].complete&&i[k].naturalWidth>0){n++}}
document.body.setAttribute('data-images',n+'/'+i.length)});</script>"""


def _html(title: str, ctx: Context, tables: dict[str, Table], figures: list[str],
          undrawn: list[str], found: list[claims_mod.Claim]) -> str:
    toc = "".join(f'<li><a href="#{k}">{html.escape(t.title.split(" — ")[0])}</a></li>'
                  for k, t in tables.items())
    toc += "".join(f'<li><a href="#fig-{f}">figure: {f}</a></li>' for f in figures)
    claims = "".join(
        f"<li><b>{html.escape(c.text)}</b>: {html.escape(c.verdict)}"
        + (f" ({html.escape(c.method)})" if c.method else "")
        + (f" <span class='paper'>(paper's numbers: {html.escape(c.paper_verdict)})</span>"
           if c.paper_verdict else "")
        + "<ul>" + "".join(f"<li>{html.escape(d)}</li>" for d in c.details) + "</ul></li>"
        for c in found)
    figs = "".join(f'<h3 id="fig-{f}">{f}</h3><a href="figures/{f}.svg">'
                   f'<img src="figures/{f}.png" alt="{f}"></a>' for f in figures)
    figs += "".join(f'<h3 id="fig-{f}">{f}</h3><p class="paper">not drawn: {UNDRAWN}</p>'
                    for f in undrawn)
    runs = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(s)}</td>"
                   f"<td>{html.escape(r)}</td><td>{html.escape(c)}</td>"
                   f"<td><code>{html.escape(' '.join(ids))}</code></td></tr>"
                   for k, t in tables.items() for s, r, c, ids in t.run_ids())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{CSS}</style>{IMAGE_CHECK}</head><body>
<h1>{html.escape(title)}</h1>
<p class="banner">Scale: <b>{html.escape(ctx.scale)}</b>. {html.escape(ctx.scale_note)}.
Store: <code>{html.escape(ctx.store.uri)}</code>, experiment
<code>{html.escape(ctx.store.experiment)}</code>; {len(ctx.cells)} cells, {len(ctx.store.runs)} runs
read. Generated {time.strftime('%Y-%m-%d %H:%M:%S')}.</p>
<ul>{toc}</ul>
<h2>Claims</h2><ul>{claims}</ul>
<h2>Tables</h2>{''.join(t.to_html() for t in tables.values())}
<h2>Figures</h2>{figs}
<h2 id="runs">MLflow runs behind each cell</h2>
<table><thead><tr><th>table</th><th>section</th><th>row</th><th>column</th><th>run ids</th></tr>
</thead><tbody>{runs}</tbody></table>
</body></html>
"""
