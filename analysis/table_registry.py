"""The report's tables and figures, each registered under a key.

A builder takes the report's `Context` and returns a `Table` (a figure: a matplotlib Figure, or
None when nothing of it has run). A sweep names the keys it feeds in its own file,
`hydra.sweeper.report: {tables: [...], figures: [...]}`; a report holds the keys its sweep and
the sweeps it includes name. Adding a table is one decorated builder and its key in the file of
the sweep whose runs it shows:

    @register_table("table10")
    def my_table(ctx: Context) -> Table: ...

The builders live in `analysis.tables_accuracy`, `analysis.tables_cost`, `analysis.figures` and
`analysis.figures_dynamics` (`analysis.builders` imports them: this module imports none, so they
can import it). A report lists its tables in the paper's order (`table<N>` by N, then the others
in the order they were registered) and its figures in registration order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from analysis.context import Context
    from analysis.table import Table

TableBuilder = Callable[["Context"], "Table"]
FigureBuilder = Callable[["Context"], Any]  # a matplotlib Figure or None
B = TypeVar("B", bound=Callable[..., Any])

TABLES: dict[str, TableBuilder] = {}
FIGURES: dict[str, FigureBuilder] = {}


def _register(kind: str, registry: dict[str, Any], key: str) -> Callable[[B], B]:
    def add(builder: B) -> B:
        if key in registry and registry[key] is not builder:
            raise ValueError(f"{kind} {key!r} is registered twice ({registry[key].__module__} "
                             f"and {builder.__module__}); give one of them another key")
        registry[key] = builder
        return builder

    return add


def register_table(key: str) -> Callable[[B], B]:
    """Decorator: `builder(ctx) -> Table` is the report's table `key`."""
    return _register("table", TABLES, key)


def register_figure(key: str) -> Callable[[B], B]:
    """Decorator: `builder(ctx) -> Figure | None` is the report's figure `key`."""
    return _register("figure", FIGURES, key)


def table_order(keys: list[str] | set[str]) -> list[str]:
    """`keys` in the report's order: `table<N>` by N, then the others as registered."""
    position = {k: i for i, k in enumerate(TABLES)}

    def rank(key: str) -> tuple[int, int]:
        number = re.fullmatch(r"table(\d+)", key)
        return (0, int(number.group(1))) if number else (1, position.get(key, len(position)))

    return sorted(keys, key=rank)


def figure_order(keys: list[str] | set[str]) -> list[str]:
    position = {k: i for i, k in enumerate(FIGURES)}
    return sorted(keys, key=lambda k: position.get(k, len(position)))
