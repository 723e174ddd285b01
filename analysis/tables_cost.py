"""Tables from configs and telemetry: 4 (hyperparameters), 5 (ratio statistics), 7 (wall-clock),
8 (peak memory)."""

from __future__ import annotations

from analysis.cell_values import Value, curve_run, find, run_value
from analysis.context import Context, Pair
from analysis.reference import METHOD_LABELS, paper
from analysis.table import Entry, Table
from analysis.table_registry import register_table
from hacrl.schema import metric_names as M
from hacrl.schema import tags as T

HYPER = (("alpha", "algo.alpha", "α"), ("cross_clip_lower", "algo.cross_clip_lower", "lower bound"),
         ("cross_clip_step", "algo.delta_step", "δ step"))


@register_table("table4")
def hyperparameters_table(ctx: Context) -> Table:
    """Table 4: each pair's alpha, lower bound and delta_step as the HACPO runs logged them."""
    ref = paper("hyperparameters")
    table = Table("table4", f"Table 4: HACPO hyperparameters per pair — {ctx.scale_note}; "
                  "from the params of the runs (the config where a cell has not run)",
                  [label for _, _, label in HYPER])
    seen: set[str] = set()
    for sweep in ("table1", "table9"):
        for p in ctx.pairs_of(sweep):
            if p.name in seen:
                continue
            seen.add(p.name)
            cells = find(ctx.cells, "hacpo", list(p.agents), sweep)
            runs = ctx.store.runs
            logged = runs[(runs[T.CONFIG_HASH].isin([c.id for c in cells]))
                          & (runs[T.KIND] == T.JOB)] if cells else runs.iloc[0:0]
            published = ref[ref["pair"] == p.name]
            entries = []
            for column, param, _ in HYPER:
                value, source = None, "not in this sweep"
                if not logged.empty and logged.iloc[0][f"param:{param}"] is not None:
                    value, source = float(logged.iloc[0][f"param:{param}"]), ""
                elif cells and cells[0].params.get(param) is not None:
                    value, source = float(cells[0].params[param]), "config; not run"
                ours = Value([value], list(logged["run_id"][:1])) if value is not None else \
                    Value(reason=source)
                entry = Entry(ours, float(published[column].iloc[0]) if len(published) else None,
                              digits=3)
                entry.extra = f"({source})" if value is not None and source else ""
                entries.append(entry)
            table.add(p.setting, p.name, entries)
    return table


@register_table("table5")
def ratio_stats_table(ctx: Context) -> Table:
    """Table 5: s_homo and s_hete (per-step means) over all steps: mean, max, min, range."""
    ref = paper("ratio_stats")
    table = Table("table5", f"Table 5: sequence ratios over all steps, HACPO — {ctx.scale_note}",
                  ["mean", "max", "min", "range"])
    for p in ctx.pairs_of("table2")[:1] or ctx.pairs_of("table1")[:1]:
        cells = find(ctx.cells, "hacpo", list(p.agents), "table1") or \
            find(ctx.cells, "hacpo", list(p.agents))
        for agent in p.agents:
            for ratio in M.RATIOS:
                run_id = curve_run(ctx.store, cells[0], agent) if cells else None
                series = [v for _, v in ctx.store.history(run_id, M.ratio(ratio, "mean"))] \
                    if run_id else []
                published = ref[(ref["pair"] == p.name) & (ref["model"] == agent)
                                & (ref["ratio"] == ratio)]
                stats = ({"mean": sum(series) / len(series), "max": max(series),
                          "min": min(series), "range": max(series) - min(series)}
                         if series else {})
                entries = []
                for column in table.columns:
                    ours = Value([stats[column]], [run_id] if run_id else []) if stats else \
                        Value(reason="no ratio curve" if run_id else "not run")
                    entries.append(Entry(ours, float(published[column].iloc[0])
                                         if len(published) else None, digits=5))
                table.add(p.name, f"{agent} · {ratio}", entries)
    return table


def _timing(ctx: Context, method: str, team: list[str], metric: str) -> dict[int, Value]:
    """repeat -> the job run's metric, for the timing cells of `method` on `team`."""
    out = {}
    for cell in find(ctx.cells, method, team, "cost"):
        if cell.cost:
            out[int(cell.params.get("timing_repeat") or 0)] = run_value(ctx.store, cell, None,
                                                                         metric)
    return out


@register_table("table7")
def runtime_table(ctx: Context) -> Table:
    """Table 7: wall-clock of each method; single-agent baselines summed over both agents."""
    ref = paper("runtime")
    p = ctx.pairs_of("cost")[0]
    total = Table("table7", f"Table 7: wall-clock time — {ctx.scale_note}; ours in seconds per "
                  "job (timing cells, run alone, mean ± std over repeats), paper in minutes",
                  [*p.agents, "total", "total / GSPOx2 total"])
    totals: dict[str, tuple[Value, float | None]] = {}
    methods = [str(m) for m in ctx.grid("cost").get("method", [])]
    for method in methods:
        published = ref[(ref["pair"] == p.name) & (ref["method"] == method)]
        pub = {str(r.model): float(r.wall_minutes) for r in published.itertuples()}
        if ctx.shares_rollouts(method):  # one job trains the whole team
            per_agent = [Entry(None, None, compare=False) for _ in p.agents]
            summed = _timing(ctx, method, list(p.agents), M.WALL)
        else:
            parts = [_timing(ctx, method, [a], M.WALL) for a in p.agents]
            per_agent = [Entry(Value.combine(list(d.values())) if d else Value(reason="not run"),
                               pub.get(a), digits=1, compare=False)
                         for a, d in zip(p.agents, parts, strict=True)]
            repeats = sorted(set.intersection(*(set(d) for d in parts))) if parts else []
            summed = {r: Value([sum(d[r].values[0] for d in parts)],
                               [i for d in parts for i in d[r].run_ids])
                      for r in repeats if all(d[r].mean is not None for d in parts)}
        value = Value.combine(list(summed.values())) if summed else Value(reason="not run")
        totals[method] = (value, pub.get("total"))
        entries = [*per_agent, Entry(value, pub.get("total"), digits=1, compare=False)]
        total.add(p.name, METHOD_LABELS.get(method, method), [*entries, Entry()])
    base, base_paper = totals.get("gspo_x2", (Value(), None))
    for (_, _, entries), method in zip(total.rows, methods, strict=True):
        value, published_total = totals[method]
        ratio = (Value([value.mean / base.mean], value.run_ids) if value.mean and base.mean
                 else Value(reason="needs both totals"))
        entries[-1] = Entry(ratio, published_total / base_paper
                            if published_total and base_paper else None, digits=2)
    total.notes.append("The ratio column compares like with like: HACPO's wall time relative to "
                       "GSPOx2's, at each scale.")
    return total


@register_table("table8")
def memory_table(ctx: Context) -> Table:
    """Table 8: peak memory of each timing cell's job (CPU: peak RSS in GB; GPU: % of memory)."""
    ref = paper("memory")
    p: Pair = ctx.pairs_of("cost")[0]
    gpu = ctx.scale == "paper"
    metric = M.DEVICE_USED_FRAC if gpu else M.PEAK_RSS
    unit = "% of GPU memory" if gpu else "GB peak RSS (CPU)"
    table = Table("table8", f"Table 8: peak memory — {ctx.scale_note}; ours in {unit}, paper in "
                  "% of GPU memory", [*p.agents, "overall"])
    for method in [str(m) for m in ctx.grid("cost").get("method", [])]:
        published = ref[(ref["pair"] == p.name) & (ref["method"] == method)]
        pub = {str(r.model): float(r.peak_gpu_memory_percent) for r in published.itertuples()}
        shared = ctx.shares_rollouts(method)
        teams = [list(p.agents)] if shared else [[a] for a in p.agents]
        entries = []
        for team in teams:
            found = _timing(ctx, method, team, metric)
            v = Value.combine(list(found.values())) if found else Value(reason="not run")
            if gpu and v.values:
                v = Value([100 * x for x in v.values], v.run_ids)
            entries.append(Entry(v, pub.get(team[0] if len(team) == 1 else "overall"),
                                 digits=2, compare=gpu))
        if shared:
            entries = [Entry(None, None) for _ in p.agents] + entries
        else:
            entries.append(Entry(None, None))
        table.add(p.name, METHOD_LABELS.get(method, method), entries)
    return table
