"""The script's source as an AST the static rules can ask questions of.

The main question is "does this line run once per step?": it does when it sits in a loop,
or in a function that is called from a loop (followed through the file), or in a method the
framework calls per step (``forward``, ``training_step``, ``__getitem__``, ...).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..sites import Site

__all__ = ["SourceIndex", "dotted_name", "load_sources"]

PER_STEP_METHODS = frozenset(
    {"forward", "training_step", "validation_step", "__getitem__", "__iter__", "__next__", "train_step", "step"}
)
_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def dotted_name(node: ast.AST) -> str:
    """``torch.cuda.empty_cache`` for the expression ``torch.cuda.empty_cache`` (else '')."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call):
        parts.append(dotted_name(node.func) + "()")
    else:
        return ".".join(reversed(parts)) if parts else ""
    return ".".join(reversed(parts))


@dataclass
class SourceIndex:
    path: str
    text: str
    tree: ast.Module
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)
    loop_called: set[str] = field(default_factory=set)

    @classmethod
    def parse(cls, path: str) -> "SourceIndex | None":
        try:
            text = Path(path).read_text(encoding="utf-8")
            tree = ast.parse(text, filename=path)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            return None
        index = cls(path=path, text=text, tree=tree)
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                index.parents[child] = node
        index._find_loop_called()
        return index

    # -- structure ------------------------------------------------------------------------------

    def enclosing_function(self, node: ast.AST) -> ast.AST | None:
        parent = self.parents.get(node)
        while parent is not None and not isinstance(parent, _FUNCS):
            parent = self.parents.get(parent)
        return parent

    def in_direct_loop(self, node: ast.AST) -> bool:
        """Inside a loop body of its own function (or of the module)."""
        child, parent = node, self.parents.get(node)
        while parent is not None and not isinstance(parent, _FUNCS):
            if isinstance(parent, _LOOPS):
                # The iterable of a for loop runs once; its body every iteration.
                if not (isinstance(parent, (ast.For, ast.AsyncFor)) and child is parent.iter):
                    return True
            child, parent = parent, self.parents.get(parent)
        return False

    def runs_per_step(self, node: ast.AST) -> bool:
        """In a loop, or in a function called from a loop or by the framework per step."""
        if self.in_direct_loop(node):
            return True
        func = self.enclosing_function(node)
        while func is not None:
            name = getattr(func, "name", None)
            if name in PER_STEP_METHODS or name in self.loop_called:
                return True
            if self.in_direct_loop(func):
                return True
            func = self.enclosing_function(func)
        return False

    def _find_loop_called(self) -> None:
        calls_by_func: dict[str, set[str]] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                name = dotted_name(node.func).split(".")[-1]
                if self.in_direct_loop(node):
                    self.loop_called.add(name)
                func = self.enclosing_function(node)
                func_name = getattr(func, "name", None)  # a lambda has none
                if func is not None and func_name:
                    calls_by_func.setdefault(func_name, set()).add(name)
        # A function called from a loop runs its callees per step too (within this file).
        changed = True
        while changed:
            changed = False
            for caller, callees in calls_by_func.items():
                if caller in self.loop_called or caller in PER_STEP_METHODS:
                    new = callees - self.loop_called
                    if new:
                        self.loop_called |= new
                        changed = True

    # -- queries ----------------------------------------------------------------------------------

    @functools.cached_property
    def imported_as(self) -> dict[str, str]:
        """Names this file binds by an import with ``as``, to what they name: ``{"DDP":
        "torch.nn.parallel.DistributedDataParallel"}`` for ``from torch.nn.parallel import DistributedDataParallel as
        DDP``, ``{"nnp": "torch.nn.parallel"}`` for ``import torch.nn.parallel as nnp``."""
        out = {}
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                module = "." * getattr(node, "level", 0) + (getattr(node, "module", None) or "")
                for alias in node.names:
                    if alias.asname and alias.asname != alias.name:
                        out[alias.asname] = f"{module}.{alias.name}" if isinstance(node, ast.ImportFrom) else alias.name
        return out

    def calls(self, *suffixes: str) -> Iterator[tuple[ast.Call, str]]:
        """Calls whose dotted name ends with one of ``suffixes`` (``"torch.save"`` matches ``torch.save``), with the
        name as the file writes it; a name bound by ``import ... as`` is matched by what it names (``DDP(...)`` is a
        call of ``DistributedDataParallel``)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                name = dotted_name(node.func)
                head, dot, rest = name.partition(".")
                resolved = self.imported_as.get(head, head) + dot + rest
                if any(
                    resolved == s or resolved.endswith("." + s) or (not s.count(".") and resolved.split(".")[-1] == s)
                    for s in suffixes
                ):
                    yield node, name

    def site(self, node: ast.AST) -> Site:
        func = self.enclosing_function(node)
        return Site(self.path, getattr(node, "lineno", 1), getattr(func, "name", "<module>") if func else "<module>")

    @functools.cached_property
    def mentions_cuda(self) -> bool:
        """The script was written for a GPU (it names cuda), even if this run is on the CPU."""
        return "cuda" in self.text


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def is_const(node: ast.expr | None, value) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def load_sources(paths: list[str]) -> dict[str, SourceIndex]:
    out = {}
    for path in paths:
        index = SourceIndex.parse(path)
        if index is not None:
            out[path] = index
    return out
