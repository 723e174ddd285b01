"""The per-agent power of Table 1's HACPO − GSPOx2 comparisons at tiny scale, from a pilot.

Reads a finished `hacrl sweep table1` (its output root: the MLflow store and the sweep's
manifest), measures each agent's paired design (`analysis.power.design_of`: problem counts,
variances, the correlation of the two methods' scores, the seed effect), and prints the MDE the
report's test would have (80% power, Holm's strictest level 0.05 / 6) at other seed counts.
`--write` records the designs in analysis/reference/tiny/designs.json, where the report reads
them to print each comparison's predicted MDE beside its measured one.

    python scripts/tiny_design.py OUTPUT_ROOT [--seeds 3 5 6 8 10] [--write]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from analysis.context import Context  # noqa: E402
from analysis.evidence import evidence_of  # noqa: E402
from analysis.power import design_of, design_record, needed_seeds, plan  # noqa: E402
from analysis.reference import DESIGNS_FILE  # noqa: E402
from analysis.store import open_store  # noqa: E402
from hacrl.schema.sweep_manifest import read_manifest  # noqa: E402

FAMILY = 6  # Table 1's per-agent claim: 3 pairs x 2 agents, Holm's strictest level alpha / 6
ALPHA = 0.05


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output_root", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[3, 5, 6, 8, 10])
    ap.add_argument("--experiment", default="hacrl-tiny")
    ap.add_argument("--write", action="store_true", help=f"record the designs in {DESIGNS_FILE}")
    ap.add_argument("--source", default="",
                    help="what made the pilot (e.g. the commit and command), recorded with it")
    args = ap.parse_args()
    manifest = read_manifest(args.output_root / "sweeps" / "table1")
    if manifest is None or manifest.pairs is None or manifest.methods is None:
        print(f"no Table-1 manifest (format 3) under {args.output_root}/sweeps/table1",
              file=sys.stderr)
        return 2
    store = open_store(f"sqlite:///{args.output_root.resolve() / 'mlflow.db'}", args.experiment)
    ctx = Context(store, manifest.cells, "tiny", manifest.grids or {}, pairs=manifest.pairs,
                  methods=manifest.methods)
    evidence = evidence_of(ctx)
    protocol = ctx.protocol_of("table1")
    records: dict[str, dict] = {}
    print(f"per-agent HACPO - GSPOx2, MDE in points at 80% power and alpha {ALPHA}/{FAMILY}")
    print("| pair / agent | pilot seeds | seeds' share of the variance | "
          + " | ".join(f"{s} seeds" for s in args.seeds) + " | seeds for 3 pt |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in args.seeds) + " | --- |")
    for p in ctx.pairs_of("table1"):
        for agent in p.agents:
            a = evidence.cell("hacpo", p, agent, "table1", protocol)
            b = evidence.cell("gspo_x2", p, agent, "table1", protocol)
            common = [s for s in a.seeds if s in b.runs]
            if a.scores is None or b.scores is None or len(common) < 2:
                print(f"| {p.name} / {agent} | not measurable: {a.reason or b.reason} |")
                continue
            design = design_of(a.for_seeds(common), b.for_seeds(common))
            mdes = [100 * plan(design.with_seeds(s), alpha=ALPHA / FAMILY).mde
                    for s in args.seeds]
            need = needed_seeds(design, 0.03, alpha=ALPHA / FAMILY)
            # what more seeds can reduce (the seed part) against what more problems can (the
            # problem part), in the pilot's own design
            parts = design.components()
            share = parts.seeds / (parts.seeds + max(0.0, parts.problems))
            print(f"| {p.name} / {agent} | {len(common)} | {share:.2f} | "
                  + " | ".join(f"{m:.2f}" for m in mdes) + f" | {need} |")
            records[f"{p.name}/{agent}"] = design_record(design)
    if args.write:
        DESIGNS_FILE.parent.mkdir(parents=True, exist_ok=True)
        DESIGNS_FILE.write_text(json.dumps({
            "what": "per-agent HACPO - GSPOx2 designs of a tiny Table-1 sweep (the pilot the "
                    "report's predicted MDEs come from)",
            "measured": {"date": time.strftime("%Y-%m-%d"),
                         "source": args.source or str(args.output_root)},
            "comparisons": records}, indent=1) + "\n")
        print(f"wrote {DESIGNS_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
