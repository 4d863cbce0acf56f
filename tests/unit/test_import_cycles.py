"""No import cycles between ddl's modules or within a plugin (issue 50): two modules that
import each other, directly or round a longer loop, are one module in two files, and a
newcomer cannot read either first. Imports inside functions count too (they hide a cycle,
they do not remove it); ``if TYPE_CHECKING:`` imports do not (they never run).

Read from the source with ``ast`` (import-linter has no cycle contract in the version
pinned here). ``KNOWN`` lists the cycles left to take apart; it may only shrink: a new
cycle fails, and so does an entry that is gone (remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

ROOTS = [REPO / "packages" / "core" / "src",
         *sorted((REPO / "packages" / "plugins").glob("*/src"))]
KNOWN: set[frozenset[str]] = set()


def modules(roots: list[Path]) -> dict[str, Path]:
    found = {}
    for root in roots:
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``."""
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(n) for n in ast.walk(node))
    return hidden


def graph(found: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules it imports (a ``from package import name`` of a sub-module
    imports that sub-module; of another name, the package)."""
    edges: dict[str, set[str]] = {m: set() for m in found}
    for module, path in found.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        hidden = _type_checking_blocks(tree)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in found else base
                           for a in node.names]
            for target in targets:
                while target and target not in found:
                    target = target.rpartition(".")[0]
                if target and target != module and not module.startswith(target + "."):
                    edges[module].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_beyond_the_known_ones():
    found = cycles(graph(modules(ROOTS)))
    new = [sorted(c) for c in found - KNOWN]
    assert not new, f"import cycles: {new}"
    gone = [sorted(c) for c in KNOWN - found]
    assert not gone, f"taken apart (remove from KNOWN): {gone}"


def test_a_planted_cycle_is_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.c import g\n")
    (package / "c.py").write_text("import pkg.a\n")
    (package / "d.py").write_text("from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from pkg import a\n")
    assert cycles(graph(modules([tmp_path]))) == {frozenset({"pkg.a", "pkg.b", "pkg.c"})}
