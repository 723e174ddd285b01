"""`hacrl bench step` and `hacrl bench floor`: benchmarks of one training step that print
figures."""

from __future__ import annotations

import argparse
from typing import Any


def add_parsers(sub: Any) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print figures")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    bench.set_defaults(command_run=lambda args, unknown: run(args))
    step = bench_sub.add_parser("step", help="one step of gspo_x2 vs hacpo, phase by phase, and "
                                "(local engine) each phase against its compute floor")
    step.add_argument("overrides", nargs="*", help="hydra overrides (default: tiny size pair)")
    step.add_argument("--repeats", type=int, default=3)
    floor = bench_sub.add_parser("floor", help="each phase of one step (local engine) next to its "
                                 "compute floor: the same shapes as bare model calls")
    floor.add_argument("overrides", nargs="*", help="hydra overrides (default: method=hacpo, "
                       "tiny size pair)")
    floor.add_argument("--repeats", type=int, default=3)


def run(args: argparse.Namespace) -> int:
    if args.bench_command == "floor":
        from hacrl.bench.compute_floor import floor_report

        return floor_report(args.overrides, repeats=args.repeats)
    from hacrl.bench import step_cost

    return step_cost(args.overrides, repeats=args.repeats)
