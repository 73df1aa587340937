"""The package's modules import each other in one direction only: the
module-level imports among ``snapcoord.*`` form a DAG, and no module hides
an import of the package inside a function or behind ``if TYPE_CHECKING``
(the way a cycle is usually papered over). Read from the package the tests
import, the installed one under ``make test``."""

from __future__ import annotations

import ast
import os
import pathlib

import pytest
from conftest import REPO

import snapcoord

ROOT = pathlib.Path(snapcoord.__file__).resolve().parent


@pytest.mark.skipif(os.environ.get("SNAPCOORD_TEST_INSTALLED") != "1", reason="not run by make test-python")
def test_the_tests_import_the_installed_package() -> None:
    """Under ``make test`` (test-python) the tests see what a user installs:
    the wheel's files in the venv's site-packages, not the source tree."""
    assert not ROOT.is_relative_to(REPO / "client" / "python"), ROOT
    assert ROOT.parent.name == "site-packages", ROOT


def module_name(path: pathlib.Path) -> str:
    parts = ["snapcoord", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: set[str]) -> list[str]:
    """The snapcoord modules ``node`` imports (a name imported from a
    package counts as its submodule when there is one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "snapcoord"]
    base = node.module or ""
    if node.level:
        anchor = module.split(".")
        anchor = anchor if is_package else anchor[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    if base.split(".")[0] != "snapcoord":
        return []
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]


def test_module_imports_form_a_dag_with_none_hidden() -> None:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    assert {"snapcoord.client", "snapcoord.trainer", "snapcoord.env_worker", "snapcoord._worker"} <= modules, modules
    graph: dict[str, set[str]] = {}
    hidden: list[str] = []
    for path in paths:
        module = module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        top = set(map(id, tree.body))
        edges = graph.setdefault(module, set())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = imported(node, module, path.name == "__init__.py", modules)
            if targets and id(node) not in top:
                hidden.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
            # Importing snapcoord.a.b runs snapcoord/__init__ first, but
            # that is not this module's dependency: edges to the packages
            # above a module are left out.
            edges.update(t for t in targets if not module.startswith(t + ".") and t != module)
    assert hidden == [], "imports of the package not at module level (in a function, a class, or behind a condition):\n" + "\n".join(hidden)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt)
            if found:
                return found
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start)
        if found:
            return found
    return None


def test_the_cycle_finder_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
