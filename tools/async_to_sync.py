#!/usr/bin/env python3
"""Write taskq's sync face from its async body: `runtime/<module>_sync.py` from `runtime/<module>.py`.

    python tools/async_to_sync.py          # (re)write every generated module
    python tools/async_to_sync.py --check  # exit 1, naming them, if any generated module is stale

The idea is psycopg's (`psycopg:tools/async_to_sync.py`): one model, two faces, no second copy kept by
hand. This one works on the AST of each async module:

- only the top-level definitions that need it are converted: those with `async`/`await`, or naming
  something that has a sync counterpart (AsyncConnection, the async Backend, a converted function...),
  found as a fixed point across all modules. Everything else (validation, option checks, dataclasses,
  constants) is imported from the async module, so the sync module holds no copy of it;
- `async def`/`async with`/`async for`/`await` lose their async; `Awaitable[T]` becomes `T`;
- names are mapped (MAPPED below, plus the converted names of MODULES): AsyncConnection -> Connection,
  AsyncConnectionPool -> taskq.backend.sync_pool.LazyConnectionPool (opened lazily per process), asyncio.sleep
  -> time.sleep, Backend -> SyncBackend, JobsClient -> SyncJobsClient, `from taskq.ops import jobs` ->
  jobs_sync for what it converts, and so on;
- comments inside a converted definition are carried over (ast_comments); the result is unparsed, its imports
  pruned and sorted and the code formatted with ruff, under a header saying it is generated.

To add a module (a new service module with async functions over the Backend), add it to MODULES, run
this script, and import its sync face where the sync client needs it. The test
`tests/unit/test_sync_generated.py` fails while a generated module is stale.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import ast_comments

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Module:
    name: str  # the async module, e.g. taskq.backend
    renames: dict[str, str] = field(default_factory=dict)  # converted class names that change

    @property
    def sync_name(self) -> str:
        return self.name + "_sync"

    @property
    def source(self) -> Path:
        return ROOT / "runtime" / (self.name.removeprefix("taskq.").replace(".", "/") + ".py")

    @property
    def target(self) -> Path:
        return ROOT / "runtime" / (self.sync_name.removeprefix("taskq.").replace(".", "/") + ".py")


MODULES = [
    Module("taskq.backend.caller"),
    Module("taskq.backend.core", {"Backend": "SyncBackend"}),
    Module("taskq.backend.unique"),
    Module("taskq.ops.jobs"),
    Module("taskq.ops.schedules"),
    Module("taskq.backend.dependencies"),
    Module("taskq.workflows"),
    Module("taskq.backend.queues"),
    Module("taskq.ops.queues"),
    Module("taskq.backend.durable"),
    Module("taskq.ops.durable"),
    Module("taskq.client", {"JobsClient": "SyncJobsClient", "JobHandle": "SyncJobHandle"}),
]

REEXPORTED = {"taskq.backend.core": "taskq.backend"}
"""Modules whose names their package's __init__ re-exports (`from taskq.backend import Backend`)."""

MAPPED: dict[tuple[str, str], tuple[str, str]] = {
    ("psycopg", "AsyncConnection"): ("psycopg", "Connection"),
    ("psycopg", "AsyncCursor"): ("psycopg", "Cursor"),
    ("psycopg_pool", "AsyncConnectionPool"): ("taskq.backend.sync_pool", "LazyConnectionPool"),
    ("taskq.backend.notify", "EnqueueNotifier"): ("taskq.backend.sync_pool", "SyncNotifier"),
    ("contextlib", "asynccontextmanager"): ("contextlib", "contextmanager"),
    ("contextlib", "AbstractAsyncContextManager"): ("contextlib", "AbstractContextManager"),
    ("collections.abc", "AsyncIterator"): ("collections.abc", "Iterator"),
    ("collections.abc", "AsyncIterable"): ("collections.abc", "Iterable"),
    ("collections.abc", "AsyncGenerator"): ("collections.abc", "Generator"),
    ("asyncio", "sleep"): ("time", "sleep"),
    ("taskq.backend._conn", "ReadWritePool"): ("taskq.backend.sync_pool", "LazyConnectionPool"),
}
UNWRAPPED = {("collections.abc", "Awaitable"), ("typing", "Awaitable")}
METHODS = {"__aenter__": "__enter__", "__aexit__": "__exit__", "aclose": "close"}
ASYNC_NODES = (ast.AsyncFunctionDef, ast.Await, ast.AsyncWith, ast.AsyncFor)


def _mapping(converted: dict[str, set[str]]) -> dict[tuple[str, str], tuple[str, str]]:
    mapping = dict(MAPPED)
    for mod in MODULES:
        for name in converted.get(mod.name, ()):
            mapping[(mod.name, name)] = (mod.sync_name, mod.renames.get(name, name))
            if mod.name in REEXPORTED:  # a name its package re-exports, imported from the package
                mapping.setdefault((REEXPORTED[mod.name], name), (mod.sync_name, mod.renames.get(name, name)))
    return mapping


def _module_of(node: ast.ImportFrom) -> str:
    return node.module or ""


class Scope:
    """What the names of one async module mean: local names to rename, names to unwrap, module aliases."""

    def __init__(self, tree: ast.Module, mod: Module, mapping: dict[tuple[str, str], tuple[str, str]]) -> None:
        self.mapping = mapping
        self.renamed: dict[str, str] = dict(mod.renames)
        self.unwrapped: set[str] = set()
        self.modules: dict[str, str] = {}  # local name -> module it names
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.modules[alias.asname or alias.name.split(".")[0]] = alias.name
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    local = alias.asname or alias.name
                    key = (_module_of(node), alias.name)
                    if key in mapping and alias.asname is None:
                        self.renamed[local] = mapping[key][1]
                    elif key in UNWRAPPED:
                        self.unwrapped.add(local)
                    elif any(m.name == f"{_module_of(node)}.{alias.name}" for m in MODULES):
                        self.modules[local] = f"{_module_of(node)}.{alias.name}"

    def attribute_target(self, node: ast.Attribute) -> tuple[str, str] | None:
        if isinstance(node.value, ast.Name) and node.value.id in self.modules:
            return self.mapping.get((self.modules[node.value.id], node.attr))
        return None

    def needs_conversion(self, node: ast.AST, converted: set[str]) -> bool:
        for sub in ast.walk(node):
            if isinstance(sub, ASYNC_NODES) or (isinstance(sub, ast.comprehension) and sub.is_async):
                return True
            if isinstance(sub, ast.Name) and (
                sub.id in self.renamed or sub.id in self.unwrapped or sub.id in converted
            ):
                return True
            if isinstance(sub, ast.Attribute) and self.attribute_target(sub) is not None:
                return True
        return False


def _defined(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _is_import_block(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import | ast.ImportFrom):
        return True
    return isinstance(node, ast.If) and all(
        isinstance(s, ast.Import | ast.ImportFrom | ast_comments.Comment) for s in node.body
    )


def _body(tree: ast.Module) -> list[ast.stmt]:
    """The module's statements after its docstring, without its top-level comments (those stay with the async
    module; comments inside a converted definition are carried over)."""
    body = [node for node in tree.body if not isinstance(node, ast_comments.Comment)]
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return body[1:]
    return body


def _definitions(tree: ast.Module) -> list[ast.stmt]:
    return [
        node for node in _body(tree)
        if not _is_import_block(node) and not all(n.startswith("__") for n in _defined(node) or ["x"])
    ]


def converted_names(parsed: dict[str, ast.Module]) -> dict[str, set[str]]:
    """For every module, the top-level names that get a sync counterpart (a fixed point across modules)."""
    converted: dict[str, set[str]] = {mod.name: set() for mod in MODULES}
    changed = True
    while changed:
        changed = False
        mapping = _mapping(converted)
        for mod in MODULES:
            tree = parsed[mod.name]
            scope = Scope(tree, mod, mapping)
            for node in _definitions(tree):
                names = _defined(node)
                if names and not set(names) <= converted[mod.name]:
                    if scope.needs_conversion(node, converted[mod.name]):
                        converted[mod.name] |= set(names)
                        changed = True
    return converted


class ToSync(ast.NodeTransformer):
    def __init__(self, scope: Scope, text_renames: dict[str, str]) -> None:
        self.scope = scope
        self.text = re.compile(r"\b(" + "|".join(map(re.escape, text_renames)) + r")\b") if text_renames else None
        self.text_renames = text_renames
        self.extra_imports: set[tuple[str, str]] = set()

    # -- async constructs --------------------------------------------------------------------------

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.FunctionDef:
        self.generic_visit(node)
        new = ast.FunctionDef(
            name=METHODS.get(node.name, node.name), args=node.args, body=node.body,
            decorator_list=node.decorator_list, returns=node.returns, type_comment=node.type_comment,
        )
        if sys.version_info >= (3, 12):
            new.type_params = node.type_params
        return ast.copy_location(new, node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        self.generic_visit(node)
        self._docstring(node)
        node.name = METHODS.get(node.name, node.name)
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        self.generic_visit(node)
        self._docstring(node)
        node.name = self.scope.renamed.get(node.name, node.name)
        return node

    def visit_Await(self, node: ast.Await) -> ast.expr:
        return self.visit(node.value)  # type: ignore[no-any-return]

    def visit_AsyncWith(self, node: ast.AsyncWith) -> ast.With:
        self.generic_visit(node)
        return ast.copy_location(ast.With(items=node.items, body=node.body, type_comment=node.type_comment), node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.For:
        self.generic_visit(node)
        new = ast.For(target=node.target, iter=node.iter, body=node.body, orelse=node.orelse,
                      type_comment=node.type_comment)
        return ast.copy_location(new, node)

    def visit_comprehension(self, node: ast.comprehension) -> ast.comprehension:
        self.generic_visit(node)
        node.is_async = 0
        return node

    # -- names -------------------------------------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self.scope.renamed.get(node.id, node.id)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        target = self.scope.attribute_target(node)
        if target is None:
            self.generic_visit(node)
            node.attr = METHODS.get(node.attr, node.attr)
            return node
        module, name = target
        assert isinstance(node.value, ast.Name)
        if module == self.scope.modules[node.value.id]:
            return ast.copy_location(ast.Attribute(value=node.value, attr=name, ctx=node.ctx), node)
        parent, _, last = module.rpartition(".")
        if any(m.sync_name == module for m in MODULES):  # imported beside its async module, under its local name
            local = f"{node.value.id}_sync" if module == self.scope.modules[node.value.id] + "_sync" else last
            return ast.copy_location(
                ast.Attribute(value=ast.Name(id=local, ctx=ast.Load()), attr=name, ctx=node.ctx), node
            )
        self.extra_imports.add((parent, last))
        return ast.copy_location(ast.Attribute(value=ast.Name(id=last, ctx=ast.Load()), attr=name, ctx=node.ctx), node)

    def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
        if isinstance(node.value, ast.Name) and node.value.id in self.scope.unwrapped:
            return self.visit(node.slice)  # type: ignore[no-any-return]
        self.generic_visit(node)
        return node

    def visit_Comment(self, node: ast_comments.Comment) -> ast_comments.Comment:
        """A comment of a converted definition, as the sync face reads it."""
        text = sync_text(node.value)
        node.value = self.text.sub(lambda m: self.text_renames[m.group(1)], text) if self.text is not None else text
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        if isinstance(node.value, str) and self.text is not None:
            node.value = self.text.sub(lambda m: self.text_renames[m.group(1)], node.value)
        return node

    def _docstring(self, node: ast.FunctionDef | ast.ClassDef) -> None:
        first = node.body[0] if node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            first.value.value = sync_text(first.value.value)

    # -- imports -----------------------------------------------------------------------------------

    def visit_ImportFrom(self, node: ast.ImportFrom) -> list[ast.stmt]:
        module = _module_of(node)
        kept: list[ast.alias] = []
        moved: dict[str, list[ast.alias]] = {}
        for alias in node.names:
            key = (module, alias.name)
            if key in self.scope.mapping:
                new_module, new_name = self.scope.mapping[key]
                moved.setdefault(new_module, []).append(ast.alias(name=new_name, asname=alias.asname))
            else:
                kept.append(alias)
                if any(m.name == f"{module}.{alias.name}" for m in MODULES):
                    asname = alias.asname + "_sync" if alias.asname else None
                    moved.setdefault(module, []).append(ast.alias(name=alias.name + "_sync", asname=asname))
        out: list[ast.stmt] = []
        if kept:
            out.append(ast.ImportFrom(module=module, names=kept, level=0))
        out += [ast.ImportFrom(module=m, names=names, level=0) for m, names in moved.items()]
        return [ast.copy_location(s, node) for s in out]


def sync_text(text: str) -> str:
    """A docstring as the sync face reads it."""
    text = re.sub(r"\bawait\s+", "", text)
    return re.sub(r"\basync (with|for|def)\b", r"\1", text)


HEADER = """\
# This file is generated by tools/async_to_sync.py from {source}: do not edit it.
# Edit the async module, then run `python tools/async_to_sync.py` (a test fails while this file is stale).
"""


def generate(mod: Module, tree: ast.Module, converted: dict[str, set[str]]) -> str:
    mapping = _mapping(converted)
    scope = Scope(tree, mod, mapping)
    text_renames = {old: new for m in MODULES for old, new in m.renames.items()}
    text_renames["AsyncConnection"] = "Connection"
    transformer = ToSync(scope, text_renames)
    own = converted[mod.name]
    doc = ast.get_docstring(tree, clean=False) or ""
    docstring = str(transformer.visit_Constant(ast.Constant(sync_text(doc))).value)
    heading = f"The sync face of `{mod.name}`, generated from it.\n\n{docstring}".rstrip() + "\n"
    out: list[ast.stmt] = [ast.Expr(ast.Constant(heading))]
    imports: list[ast.stmt] = []
    definitions: list[ast.stmt] = []
    shared: list[str] = []
    for node in _body(tree):
        if _is_import_block(node):
            imports.append(node)
        elif node in _definitions(tree) and set(_defined(node)) & own:
            definitions.append(node)
        else:
            shared += [n for n in _defined(node) if not n.startswith("__")]
    new_imports: list[ast.stmt] = []
    for node in imports:
        result = transformer.visit(node)
        new_imports += result if isinstance(result, list) else [result]
    lines = mod.source.read_text(encoding="utf-8").splitlines()
    for node in definitions:
        for number in range(node.lineno, (node.end_lineno or node.lineno) + 1):
            if re.search(r"#\s*(type:\s*ignore|noqa)", lines[number - 1]):
                # comments do not survive the AST: write the async code so that it needs none
                raise SystemExit(f"{mod.source.relative_to(ROOT)}:{number}: a converted definition may not rely on a "
                                 "comment (type: ignore, noqa); write it without one")
    new_definitions = [transformer.visit(node) for node in definitions]
    for parent, last in sorted(transformer.extra_imports):
        new_imports.append(ast.ImportFrom(module=parent, names=[ast.alias(name=last)], level=0) if parent
                           else ast.Import(names=[ast.alias(name=last)]))
    if shared:
        new_imports.append(ast.ImportFrom(module=mod.name, names=[ast.alias(name=n) for n in shared], level=0))
    out += new_imports + new_definitions
    module = ast.Module(body=out, type_ignores=[])
    ast.fix_missing_locations(module)
    code = HEADER.format(source=mod.source.relative_to(ROOT)) + "\n" + ast_comments.unparse(module) + "\n"
    return _ruff(code, mod.target)


def _ruff(code: str, target: Path) -> str:
    """Prune unused imports, sort them and format, with the project's ruff settings."""
    stdin = str(target.relative_to(ROOT))
    fixed = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--fix-only", "--quiet", "--select", "F401,I", "--stdin-filename",
         stdin, "-"],
        input=code, capture_output=True, text=True, cwd=ROOT, check=True,
    ).stdout
    return subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--quiet", "--stdin-filename", stdin, "-"],
        input=fixed, capture_output=True, text=True, cwd=ROOT, check=True,
    ).stdout


def generated() -> dict[Path, str]:
    parsed = {mod.name: ast_comments.parse(mod.source.read_text(encoding="utf-8")) for mod in MODULES}
    converted = converted_names(parsed)
    return {mod.target: generate(mod, parsed[mod.name], converted) for mod in MODULES}


def stale() -> list[Path]:
    return [path for path, code in generated().items() if not path.exists() or path.read_text(encoding="utf-8") != code]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate taskq's sync modules from its async ones.")
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated module is stale; write nothing")
    args = parser.parse_args(argv)
    if args.check:
        old = stale()
        for path in old:
            print(f"stale: {path.relative_to(ROOT)} (run python tools/async_to_sync.py)", file=sys.stderr)
        return 1 if old else 0
    for path, code in generated().items():
        if not path.exists() or path.read_text(encoding="utf-8") != code:
            path.write_text(code, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
