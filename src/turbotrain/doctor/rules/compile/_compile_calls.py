"""How the script's ``torch.compile`` calls read at the lines they ran from: a module compiled in place
(``model.compile()``), a compiled model dropped (``torch.compile(model)`` as a statement) or given a name the training
step does not call (``compiled = torch.compile(model)`` while the step calls ``model``). The recorder counts each
``torch.compile`` call at the user line it came from (``Module.compile()`` calls it too)."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...analysis.source import SourceIndex
    from ...sites import Site

# How a torch.compile that ran left the model eager.
IN_PLACE = "in-place"  # model.compile(): the module compiled in place
DROPPED = "dropped"  # torch.compile(model) as a statement: its result is dropped
UNUSED = "unused"  # compiled = torch.compile(model), and the loop calls model


def in_place_compiled(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules of ``model`` compiled in place (``module.compile()`` set their compiled call), by name."""
    return [(name, m) for name, m in model.named_modules() if getattr(m, "_compiled_call_impl", None) is not None]


def _imported_modules(index: SourceIndex) -> set[str]:
    """The names ``import`` statements bind in the file (``torch``, ``re``, ``np``)."""
    return {
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(index.tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }


def _torch_names(index: SourceIndex) -> set[str]:
    """The names the file imports torch as (``torch``, or ``t`` for ``import torch as t``)."""
    return {
        alias.asname or "torch"
        for node in ast.walk(index.tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == "torch" or (alias.asname is None and alias.name.startswith("torch."))
    }


def _written(node: ast.expr) -> str:
    """A name or an attribute as written (``model``, ``self.net``); "" for any other expression."""
    return ast.unparse(node) if isinstance(node, (ast.Name, ast.Attribute)) else ""


def compile_form(index: SourceIndex, line: int, called: set[str]) -> tuple[str, str, str] | None:
    """How the ``torch.compile`` or ``.compile()`` statement at ``line`` leaves the model eager, if it does: (form,
    the model as written, the name the result was given); ``called``: the names the training step calls the model
    by, at its line."""
    modules, torch_names = _imported_modules(index), _torch_names(index)
    for node in ast.walk(index.tree):
        if getattr(node, "lineno", None) != line or not isinstance(node, (ast.Expr, ast.Assign)):
            continue
        call = node.value
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        head = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
        on_module = head in modules
        through_torch = head in torch_names or (isinstance(func, ast.Name) and func.id == "compile")
        model = _written(call.args[0]) if through_torch and call.args else ""
        if isinstance(node, ast.Expr) and isinstance(func, ast.Attribute) and func.attr == "compile":
            if through_torch:
                return (DROPPED, model, "") if model else None
            # re.compile(...) and other modules' own compile: not a module compiled in place
            return None if on_module else (IN_PLACE, _written(func.value), "")
        if isinstance(node, ast.Assign) and through_torch and model and len(node.targets) == 1:
            name = _written(node.targets[0])
            if name and name != model and model in called and name not in called:
                return UNUSED, model, name
    return None


def called_at(ctx: Context) -> set[str]:
    """The names the call at the captured forward's line calls (``model`` for ``loss = loss_fn(model(x), y)``)."""
    site = ctx.capture.site if ctx.capture is not None else None
    index = next((i for i in ctx.sources.values() if site is not None and i.path == site.file), None)
    if index is None or site is None:
        return set()
    return {
        _written(node.func)
        for node in ast.walk(index.tree)
        if isinstance(node, ast.Call) and getattr(node, "lineno", None) == site.line
    } - {""}


def compile_calls_that_ran(ctx: Context) -> list[tuple[Site, tuple[str, str, str] | None]]:
    """Each line a ``torch.compile`` call ran from, in the script's files, with :func:`compile_form` of it."""
    called = called_at(ctx)
    found = []
    for _, site, _ in ctx.seen("compile"):
        index = next((i for i in ctx.sources.values() if i.path == site.file), None)
        if index is not None:
            found.append((site, compile_form(index, site.line, called)))
    return found
