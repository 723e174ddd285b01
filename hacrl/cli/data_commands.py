"""`hacrl data prepare [names...] [--force] [--scale tiny|paper] [overrides...]` and
`hacrl data list [--scale tiny|paper] [overrides...]`.

Names and Hydra overrides (`data.root=/x`) may be mixed on the command line: an argument with
`=` is an override. `add_parsers` registers the commands on the main `hacrl` parser; `main` runs
them standalone (`python -m hacrl.cli.data_commands`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["add_parsers", "main", "run"]

_COLUMNS = ("name", "rows", "sha256", "status", "path")


def add_parsers(subparsers: Any) -> argparse.ArgumentParser:
    """Register `data` (with `prepare` and `list`) on the subparsers of the `hacrl` parser."""
    data = subparsers.add_parser("data", help="prepare and list the local data sources")
    data.set_defaults(command_run=run, takes_overrides=True)
    sub = data.add_subparsers(dest="data_command", required=True)
    prep = sub.add_parser("prepare", help="download / draw sources into data.root "
                          "(default: all; hub sources need the Hugging Face hub)")
    prep.add_argument("names", nargs="*", help="sources (from experiments/data/catalog.yaml) "
                      "and hydra overrides such as data.root=/x")
    prep.add_argument("--force", action="store_true", help="rewrite sources already prepared")
    prep.add_argument("--scale", choices=("tiny", "paper"), default=None,
                      help="only the synthetic (tiny) or the hub (paper) sources")
    lst = sub.add_parser("list", help="each source and its local status")
    lst.add_argument("names", nargs="*", help="hydra overrides such as data.root=/x")
    lst.add_argument("--scale", choices=("tiny", "paper"), default=None)
    verl = sub.add_parser("verl", help="write prepared sources as verl RL parquet "
                          "(<data.root>/verl/<name>.parquet) for engine=verl and verl's tools")
    verl.add_argument("names", nargs="*", help="sources (default: math_train) and hydra overrides")
    return data


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [_COLUMNS, *rows]) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in [_COLUMNS, *rows]]
    return "\n".join(lines)


def _prepare(data_cfg: Any, names: list[str], force: bool, scale: str | None) -> int:
    from hacrl.core.eta import ItemProgress
    from hacrl.data.prepare import prepare_source, select_sources
    from hacrl.data.sources import DataError, HubUnreachable, data_root, instruction_text

    root, instruction = data_root(data_cfg), instruction_text(data_cfg)
    table: list[tuple[str, ...]] = []
    failed = 0
    unreachable: str | None = None
    sources = select_sources(data_cfg, names or None, scale)
    shown = ItemProgress("data", [s.name for s in sources])

    def add(row: tuple[str, ...]) -> None:
        table.append(row)
        shown.finished(row[0], row[3] + (f", {row[1]} rows" if row[1] != "-" else ""))

    for source in sources:
        path = str(root / f"{source.name}.jsonl")
        if unreachable and source.is_hub and not source.is_local_path:
            # One unreachable hub is enough: each further try only waits out the same retries.
            add((source.name, "-", "-", "error: hub unreachable", path))
            failed += 1
            continue
        if source.is_hub and not source.is_local_path:
            shown.note(source.name, f"fetching {source.hub_id} from the hub")
        try:
            result = prepare_source(source, root, instruction, force)
        except DataError as err:
            print(f"hacrl: data prepare: {err}", file=sys.stderr)
            if isinstance(err, HubUnreachable):
                unreachable = str(err)
                status = "error: hub unreachable"
            else:
                status = "error"
            add((source.name, "-", "-", status, path))
            failed += 1
            continue
        add((source.name, str(result.rows), result.sha256[:12], result.status, str(result.path)))
    print(_table(table))
    if failed:
        print(f"hacrl: data prepare: {failed} of {len(table)} sources failed (see above)",
              file=sys.stderr)
    return 1 if failed else 0


def _list(data_cfg: Any, scale: str | None) -> int:
    from hacrl.data.files import inspect
    from hacrl.data.prepare import select_sources
    from hacrl.data.sources import data_root, instruction_text

    root, instruction = data_root(data_cfg), instruction_text(data_cfg)
    table: list[tuple[str, ...]] = []
    for source in select_sources(data_cfg, None, scale):
        state = inspect(root, source, instruction)
        status = state.status
        if status == "missing":
            status += " (prepared on use)" if source.kind == "synthetic" else (
                f" (hacrl data prepare {source.name})")
        table.append((source.name, "-" if state.rows is None else str(state.rows),
                      (state.sha256 or "-")[:12], status, str(state.path)))
    print(_table(table))
    return 0


def _verl(data_cfg: Any, names: list[str]) -> int:
    from hacrl.engines.verl.parquet import write_parquet

    for name in names:
        print(f"{name}: {write_parquet(data_cfg, name)}")
    return 0


def run(args: argparse.Namespace, unknown_overrides: list[str] | None = None) -> int:
    """Run a parsed `hacrl data ...` command; returns the exit code (2: config error)."""
    from hacrl.config import ConfigError, compose

    names = [a for a in args.names if "=" not in a]
    overrides = [a for a in args.names if "=" in a] + list(unknown_overrides or [])
    try:
        data_cfg = compose(overrides).data
        if args.data_command == "list":
            if names:
                raise ConfigError(f"hacrl data list takes no source names (got {' '.join(names)})")
            return _list(data_cfg, args.scale)
        if args.data_command == "verl":
            return _verl(data_cfg, names or ["math_train"])
        return _prepare(data_cfg, names, args.force, args.scale)
    except ConfigError as err:
        print(f"hacrl: data: {err}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hacrl")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args, unknown = parser.parse_known_args(argv)
    return run(args, unknown)


if __name__ == "__main__":
    sys.exit(main())
