"""The Django apps stay a house of floors (docs/architecture.md): read from the source, every import of
`dispatchlab/` (at the top of a module or inside a function) goes down or sideways without a circle,
the report pipeline knows none of the apps built on it, and no room grows past 600 lines."""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dispatchlab"
# The apps built on the report pipeline: they hear from it through dispatchlab.events.
BUILT_ON_REPORTS = ("decisions", "notify", "gpu")
MAX_MODULE_LINES = 600
# Folders whose modules the line limit reads.
LINE_LIMITED = (PACKAGE, ROOT / "worker", ROOT / "tests", ROOT / "bench")
# Written by tools, not people: Django's migrations.
GENERATED = ("migrations",)


def _modules(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*.py")):
        if not set(path.relative_to(ROOT).parts) & set(GENERATED):
            yield path


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(path: Path) -> Iterator[tuple[str, int]]:
    """Every module name this file imports, anywhere in it (function bodies included), with its line."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield module, node.lineno
            for alias in node.names:  # `from dispatchlab import events` names a module too
                yield f"{module}.{alias.name}", node.lineno


def _part(module: str) -> str | None:
    """The part of dispatchlab a module belongs to (an app, the core, config ...), None outside it."""
    parts = module.split(".")
    if parts[0] != "dispatchlab" or len(parts) < 2:
        return None
    return parts[1]


def _edges() -> dict[tuple[str, str], list[str]]:
    """(importer part, imported part) -> where, for every import between two parts of dispatchlab."""
    known = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if not p.name.startswith("_")}
    edges: dict[tuple[str, str], list[str]] = {}
    for path in _modules(PACKAGE):
        source = _part(_module_name(path))
        for module, line in _imported(path):
            target = _part(module)
            if source and target and target in known and target != source:
                places = edges.setdefault((source, target), [])
                if (place := f"{path.relative_to(ROOT)}:{line}") not in places:
                    places.append(place)
    return edges


def _cycle(edges: dict[tuple[str, str], list[str]]) -> list[str] | None:
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for following in sorted(graph.get(node, ())):
            found = visit(following, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_the_parts_of_dispatchlab_import_each_other_without_a_circle():
    edges = _edges()
    cycle = _cycle(edges)
    assert cycle is None, (
        "import circle "
        + " -> ".join(cycle)
        + "".join(f"\n{a} -> {b}: {', '.join(edges[(a, b)][:3])}" for a, b in itertools.pairwise(cycle))
    )


def test_the_report_pipeline_imports_none_of_the_apps_built_on_it():
    upward = {
        f"reports -> {target}": places
        for (source, target), places in _edges().items()
        if source == "reports" and target in BUILT_ON_REPORTS
    }
    assert upward == {}, "reports must announce an event instead (dispatchlab.events)"


def test_the_walk_sees_imports_inside_functions():
    """A walk that missed function-level imports would pass on any tree: reports' task announces its
    event by an import inside the task, and the walk must see it."""
    tasks = PACKAGE / "reports" / "tasks.py"
    assert "dispatchlab.events" in {module for module, _ in _imported(tasks)}
    assert ("reports", "events") in _edges()


def test_no_module_is_over_600_lines_outside_migrations():
    long = {
        str(path.relative_to(ROOT)): count
        for folder in LINE_LIMITED
        for path in _modules(folder)
        if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these by responsibility (docs/architecture.md): {long}"
