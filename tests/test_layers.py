"""The import rule of docs/ARCHITECTURE.md ("Layers"): every import, function-level ones
included, points down the layer table or sideways within a layer, and no import cycle exists.

Importing `a.b.c` also runs `a/__init__.py` and `a/b/__init__.py`, so those packages count as
imported too (except a module's own ancestors, which Python has initialised already).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hacrl", "analysis", "hydra_plugins")

# bottom to top; a module belongs to the longest prefix that names it ("hacrl" alone: the root)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("hacrl", "hacrl.core", "hacrl.schema")),
    ("algo", ("hacrl.algo",)),
    ("verify", ("hacrl.verify",)),
    ("resources", ("hacrl.data", "hacrl.zoo", "hacrl.checkpoint", "hacrl.tracking")),
    ("config", ("hacrl.config",)),
    ("engines", ("hacrl.engines",)),
    ("evaluation", ("hacrl.evaluation",)),
    ("training", ("hacrl.training",)),
    ("job", ("hacrl.job", "hacrl.bench")),
    ("sweep | analysis", ("hacrl.sweep", "analysis")),
    ("cli", ("hacrl.cli", "hacrl.train", "hydra_plugins")),
]
# same layer, but neither may import the other: the CLI joins them
APART = (("hacrl.sweep", "analysis"),)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or (prefix != "hacrl" and name.startswith(prefix + "."))


def layer_of(name: str) -> tuple[int, str]:
    """(rank, the prefix that placed it)."""
    best: tuple[int, str] | None = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if _within(name, prefix) and (best is None or len(prefix) > len(best[1])):
                best = (rank, prefix)
    assert best is not None, f"{name} is in no layer: add it to LAYERS and docs/ARCHITECTURE.md"
    return best


def imports(known: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its body (plus their packages;
    imports for type checking count too: a type from above is a dependency on above)."""

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                hit = resolve(target)
                if hit is None or hit == module:
                    continue
                edges[module].add(hit)
                parent = hit.rpartition(".")[0]
                while parent:  # packages run on the way, unless they are the importer's own
                    if parent in known and not _within(module, parent):
                        edges[module].add(parent)
                    parent = parent.rpartition(".")[0]
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def violations(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(edges.items()):
        rank, prefix = layer_of(module)
        for target in sorted(targets):
            target_rank, target_prefix = layer_of(target)
            apart = any((_within(module, a) and _within(target, b)) or
                        (_within(module, b) and _within(target, a)) for a, b in APART)
            if target_rank > rank:
                bad.append(f"{module} ({LAYERS[rank][0]}) imports {target} ({LAYERS[target_rank][0]})")
            elif apart:
                bad.append(f"{module} imports {target}: {prefix} and {target_prefix} stay apart")
    return bad


def test_every_module_has_a_layer() -> None:
    for module in modules():
        layer_of(module)


def test_no_import_cycles() -> None:
    found = cycles(imports(modules()))
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_imports_point_down() -> None:
    bad = violations(imports(modules()))
    assert not bad, f"{len(bad)} upward imports:\n" + "\n".join(bad)


def test_the_walk_sees_function_level_and_package_imports(tmp_path: Path) -> None:
    """The checker itself: an import inside a function, and the package an import runs."""
    known = {"hacrl.algo.x": tmp_path / "x.py", "hacrl.job": tmp_path / "job.py",
             "hacrl.evaluation": tmp_path / "__init__.py", "hacrl.evaluation.greedy": tmp_path / "g.py"}
    known["hacrl.algo.x"].write_text("def f():\n    from hacrl.job import run\n")
    known["hacrl.job"].write_text("import hacrl.evaluation.greedy\n")
    known["hacrl.evaluation"].write_text("")
    known["hacrl.evaluation.greedy"].write_text("from hacrl.algo import x\n")
    edges = imports(known)
    assert edges["hacrl.algo.x"] == {"hacrl.job"}
    assert edges["hacrl.job"] == {"hacrl.evaluation", "hacrl.evaluation.greedy"}
    assert violations(edges) == ["hacrl.algo.x (algo) imports hacrl.job (job)"]
    assert cycles(edges) == [["hacrl.algo.x", "hacrl.evaluation.greedy", "hacrl.job"]]


def test_no_two_modules_share_a_name() -> None:
    """A name says what a module is: two `config.py` (or `cli.py`, `job.py` ...) doing
    different things send a reader to the wrong file (package `__init__`/`__main__` aside)."""
    seen: dict[str, list[str]] = defaultdict(list)
    for module, path in modules().items():
        if path.name not in ("__init__.py", "__main__.py"):
            seen[path.stem].append(module)
    shared = {name: found for name, found in seen.items() if len(found) > 1}
    assert not shared, shared


# --- folders: one layer each ------------------------------------------------------------------

ENTRY_POINTS = {"hacrl", "hacrl.train"}  # the package's face (its version) and the Hydra app


def unit(module: str, known: dict[str, Path]) -> str:
    """The top-level entry of a module: `hacrl/<folder>` (or a loose `hacrl/<name>`), `analysis`,
    `hydra_plugins`."""
    parts = known[module].relative_to(ROOT).parts
    return parts[0] if parts[0] != "hacrl" else "hacrl/" + parts[1].removesuffix(".py")


def unit_edges(known: dict[str, Path], edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Which top-level entries import which (the package root, imported by everything, aside)."""
    return {(unit(a, known), unit(b, known)) for a, targets in edges.items() for b in targets
            if "hacrl" not in (a, b) and unit(a, known) != unit(b, known)}


def test_every_module_is_in_a_folder_of_one_layer() -> None:
    known = modules()
    loose = sorted(m for m, p in known.items() if p.parent == ROOT / "hacrl" and m not in ENTRY_POINTS)
    assert not loose, f"modules outside a folder: {loose} (put each in the folder of its layer)"
    layers: dict[str, set[str]] = defaultdict(set)
    for module in known:
        if module not in ENTRY_POINTS:
            layers[unit(module, known)].add(LAYERS[layer_of(module)[0]][0])
    spread = {u: sorted(names) for u, names in layers.items() if len(names) > 1}
    assert not spread, f"folders whose modules sit in several layers: {spread}"


def test_no_two_folders_import_each_other() -> None:
    known = modules()
    pairs = unit_edges(known, imports(known))
    mutual = sorted({tuple(sorted(p)) for p in pairs if (p[1], p[0]) in pairs})
    assert not mutual, f"folders importing each other: {mutual}"


if __name__ == "__main__":  # the figures docs/ARCHITECTURE.md quotes
    found = modules()
    pairs = unit_edges(found, imports(found))
    entries = sorted({unit(m, found) for m in found if m != "hacrl"})
    print(f"{sum(e.startswith('hacrl/') for e in entries)} entries of hacrl/ with Python modules; "
          f"{len(pairs)} import edges between top-level entries (hacrl/<folder>, analysis, "
          f"hydra_plugins); {len(violations(imports(found)))} upward")
