"""The import graph stays acyclic where it has been untangled (scripts/package_graph.py draws and checks it)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Packages whose modules no longer import each other in a circle.
UNTANGLED = ("bench", "train", "launch", "data", "doctor")


def _package_graph():
    spec = importlib.util.spec_from_file_location("package_graph", ROOT / "scripts" / "package_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("package", UNTANGLED)
def test_no_import_cycle_inside_the_package(package):
    graph = _package_graph()
    assert graph.cycles(graph.graph(), f"turbotrain.{package}") == []


def test_the_cycle_finder_sees_a_lazy_import_cycle():
    """The check above would pass vacuously if a function-level import were not counted."""
    graph = _package_graph()
    edges = {"turbotrain.p.a": {"turbotrain.p.b"}, "turbotrain.p.b": {"turbotrain.p.a"}, "turbotrain.p.c": set()}
    assert graph.cycles(edges, "turbotrain.p") == [["turbotrain.p.a", "turbotrain.p.b"]]


@pytest.mark.parametrize("package", UNTANGLED)
def test_no_module_imports_another_modules_private_names(package):
    """Modules share public interfaces: a ``_name`` is free to change without reading other files."""
    offenders = []
    for path in sorted((ROOT / "src" / "turbotrain" / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("turbotrain")):
                offenders += [f"{path.name}: {alias.name}" for alias in node.names
                              if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert offenders == []
