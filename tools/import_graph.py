"""The taskq package's import graph, read from the source: every import counts, top-level, deferred
(inside a function) and `if TYPE_CHECKING:` alike.

    python tools/import_graph.py            # modules in the package root, import cycles, largest modules
    python tools/import_graph.py --json     # the same as JSON
    python tools/import_graph.py --edges    # every edge, "importer -> imported (kind)"

A cycle is a strongly connected component of more than one module. Exits 1 when there is one, so CI
or a reviewer can use it as a check; the layering contracts themselves are import-linter's
(`.importlinter`, run by `.ci/check`).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the folders setuptools maps onto the package (pyproject.toml, [tool.setuptools.package-dir])
PACKAGE_DIRS = {"taskq": "runtime", "taskq.actors": "actors", "taskq.supervisor": "supervisor", "taskq.sql": "sql"}


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    kind: str  # "top", "deferred" or "type-checking"
    line: int


def modules() -> dict[str, Path]:
    """Every module of the package, by its import name."""
    found: dict[str, Path] = {}
    # the longest mapping first, so that actors/ is taskq.actors, not a folder of runtime/
    for package, folder in sorted(PACKAGE_DIRS.items(), key=lambda item: -len(item[0])):
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            relative = path.relative_to(base).with_suffix("")
            parts = [part for part in relative.parts if part != "__init__"]
            name = ".".join([package, *parts])
            found.setdefault(name, path)
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The package module an import names: the module itself, or its nearest known parent."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement with its kind."""

    def walk(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, kind
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for inner in child.body:
                    yield from walk(ast.Module(body=[inner], type_ignores=[]), "type-checking")
                for inner in child.orelse:
                    yield from walk(ast.Module(body=[inner], type_ignores=[]), kind)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, "deferred" if kind == "top" else kind)
            else:
                yield from walk(child, kind)

    yield from walk(tree, "top")


def edges(known: dict[str, Path]) -> list[Edge]:
    found: list[Edge] = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node, kind in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name if is_package else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                # `from taskq.backend import notify` imports the submodule when there is one
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                resolved = _resolve(target, known)
                if resolved is not None and resolved != name:
                    found.append(Edge(name, resolved, kind, node.lineno))
    return found


def cycles(known: dict[str, Path], graph: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    adjacent: dict[str, set[str]] = {name: set() for name in known}
    for edge in graph:
        adjacent[edge.importer].add(edge.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(adjacent[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(known)))
    for name in sorted(known):
        if name not in index:
            visit(name)
    return sorted(components, key=lambda c: (-len(c), c))


def report() -> dict[str, object]:
    known = modules()
    graph = edges(known)
    found = cycles(known, graph)
    root = [name for name, path in known.items() if path.parent == ROOT / "runtime" and path.name != "__init__.py"]
    sizes = sorted(
        ((len(path.read_text(encoding="utf-8").splitlines()), name) for name, path in known.items()), reverse=True
    )
    return {
        "modules": len(known),
        "root_modules": len(root),
        "cycles": found,
        "modules_in_cycles": sum(len(c) for c in found),
        "largest": [{"module": name, "lines": lines} for lines, name in sizes[:10]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--edges", action="store_true", help="print every edge")
    args = parser.parse_args(argv)
    if args.edges:
        for edge in sorted(edges(modules()), key=lambda e: (e.importer, e.imported)):
            print(f"{edge.importer} -> {edge.imported} ({edge.kind}, line {edge.line})")
        return 0
    result = report()
    found = result["cycles"]
    assert isinstance(found, list)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"modules: {result['modules']}, in the package root (runtime/*.py): {result['root_modules']}")
        print(f"import cycles (all imports, deferred and TYPE_CHECKING included): {len(found)}")
        for component in found:
            print(f"  {len(component)}: {', '.join(component)}")
        print("largest modules:")
        largest = result["largest"]
        assert isinstance(largest, list)
        for entry in largest:
            print(f"  {entry['lines']:5d}  {entry['module']}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
