"""Every table and figure of the report, registered: importing this module imports the modules
whose decorators fill `analysis.table_registry` (kept apart so the registry imports no builder)."""

from __future__ import annotations

import analysis.figures  # noqa: F401  (registers figures)
import analysis.figures_dynamics  # noqa: F401  (registers figures, after analysis.figures)
import analysis.tables_accuracy  # noqa: F401  (registers tables)
import analysis.tables_cost  # noqa: F401  (registers tables)
from analysis.table_registry import FIGURES, TABLES, FigureBuilder, TableBuilder


def registered() -> tuple[dict[str, TableBuilder], dict[str, FigureBuilder]]:
    """Every registered table and figure builder."""
    return TABLES, FIGURES


def unknown_keys(tables: list[str], figures: list[str]) -> list[tuple[str, str, list[str]]]:
    """(kind, key, the registered choices) of every key that names no registered builder."""
    return [(kind, key, sorted(registry)) for kind, keys, registry in
            (("tables", tables, TABLES), ("figures", figures, FIGURES))
            for key in keys if key not in registry]
