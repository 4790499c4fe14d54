"""A Python ``if`` on a tensor's value, written as ``torch.where``: what the compile-graph-break rule times for a
data-dependent branch in a compiled module's method.

Not a rule (the leading ``_`` keeps it out of the rule registry).

Only the shapes that say the same thing as one ``torch.where`` are read: each side sets one and the same name
(``if c: h = a`` with an ``else: h = b``, or none: ``h`` kept), or each side returns (``if c: return a`` and
``else: return b``). ``torch.where`` computes both sides, so the trial times what the rewrite costs as well as the
graph break it saves. The method is rewritten on a copy of the model, per instance, never on its class.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ...analysis.source import SourceIndex
    from ...sites import Site


@dataclass(frozen=True)
class WhereForm:
    """The ``if`` at a break's line, as one ``torch.where``: ``target`` (None: the branch returns) gets
    ``where(test, taken, other)``."""

    test: str
    taken: str
    other: str
    target: str | None

    def statement(self, torch_name: str | None = "torch") -> str:
        """The statement, torch named ``torch_name``; None: as the method of the tensor the taken side makes."""
        if torch_name is None:
            call = f"({self.taken}).where({self.test}, {self.other})"
        else:
            call = f"{torch_name}.where({self.test}, {self.taken}, {self.other})"
        return f"return {call}" if self.target is None else f"{self.target} = {call}"


def _assigned(body: list[ast.stmt]) -> tuple[str, ast.expr] | None:
    if len(body) == 1 and isinstance(body[0], ast.Assign) and len(body[0].targets) == 1:
        target = body[0].targets[0]
        return (target.id, body[0].value) if isinstance(target, ast.Name) else None
    return None


def _returned(body: list[ast.stmt]) -> ast.expr | None:
    only = body[0] if len(body) == 1 else None
    return only.value if isinstance(only, ast.Return) else None


def where_form(node: ast.If) -> WhereForm | None:
    """``node`` as one ``torch.where``, when it has one of the shapes the module's docstring names."""
    test = ast.unparse(node.test)
    taken, other = _assigned(node.body), _assigned(node.orelse) if node.orelse else None
    if taken is not None and (not node.orelse or (other is not None and other[0] == taken[0])):
        name = taken[0]
        return WhereForm(test, ast.unparse(taken[1]), ast.unparse(other[1]) if other else name, name)
    returned, otherwise = _returned(node.body), _returned(node.orelse) if node.orelse else None
    if returned is not None and otherwise is not None:
        return WhereForm(test, ast.unparse(returned), ast.unparse(otherwise), None)
    return None


def _if_at(tree: ast.AST, line: int) -> ast.If | None:
    """The ``if`` whose test is on ``line`` (where torch reports the break)."""
    return next(
        (n for n in ast.walk(tree) if isinstance(n, ast.If) and n.test.lineno <= line <= (n.test.end_lineno or line)),
        None,
    )


def branch_at(index: SourceIndex, line: int) -> ast.If | None:
    """The ``if`` at a break's line, inside a function."""
    node = _if_at(index.tree, line)
    return node if node is not None and index.enclosing_function(node) is not None else None


class NotRewritten(Exception):
    """The branch cannot be timed as ``torch.where``; the message says why, for the finding's note."""


def _method(cls: type, site: Site) -> tuple[str, types.FunctionType] | None:
    """The method of ``cls`` (or a base) whose code holds the break's line."""
    for klass in cls.__mro__:
        for name, value in vars(klass).items():
            code = getattr(value, "__code__", None)
            if not isinstance(value, types.FunctionType) or code is None or code.co_filename != site.file:
                continue
            lines, first = inspect.getsourcelines(value)
            if first <= site.line < first + len(lines):
                return name, value
    return None


def _rewritten(function: types.FunctionType, site: Site, form: WhereForm) -> types.FunctionType:
    """``function`` with its ``if`` at the break's line as one ``torch.where`` statement, compiled at the lines it
    came from (torch's messages keep naming the user's file)."""
    if function.__code__.co_freevars:
        raise NotRewritten(f"{function.__qualname__} uses variables of an enclosing scope (super(), a closure)")
    lines, first = inspect.getsourcelines(function)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    ast.increment_lineno(tree, first - 1)
    [defined] = tree.body
    if not isinstance(defined, ast.FunctionDef) or defined.decorator_list:
        raise NotRewritten(f"{function.__qualname__} is decorated")
    branch = _if_at(defined, site.line)
    if branch is None or where_form(branch) != form:
        raise NotRewritten(f"the source of {function.__qualname__} changed since the run")
    # torch as the method's module names it; torch.compile reads a function's globals through its module, so the
    # rewritten method keeps the module's own globals, with nothing added
    torch_name = next((name for name, value in function.__globals__.items() if value is torch), None)
    [statement] = ast.parse(form.statement(torch_name)).body
    ast.copy_location(statement, branch)
    ast.fix_missing_locations(statement)

    class Swap(ast.NodeTransformer):
        def visit_If(self, node: ast.If) -> ast.AST:
            return statement if node is branch else self.generic_visit(node)

    module = ast.fix_missing_locations(Swap().visit(tree))
    namespace: dict[str, object] = {}
    exec(compile(module, site.file, "exec"), {}, namespace)  # noqa: S102 - the user's own method, its branch a torch.where
    made = namespace[defined.name]
    assert isinstance(made, types.FunctionType)
    rewritten = types.FunctionType(made.__code__, function.__globals__, function.__name__, function.__defaults__)
    rewritten.__kwdefaults__ = function.__kwdefaults__
    return rewritten


def _rewrites(model: torch.nn.Module, site: Site, form: WhereForm) -> dict[type, tuple[str, types.FunctionType]]:
    """Per module class of ``model`` whose method holds the break's line: the method's name and its rewrite;
    NotRewritten where none holds it or it cannot be rewritten."""
    made: dict[type, tuple[str, types.FunctionType]] = {}
    for cls in {type(module) for module in model.modules()}:
        found = _method(cls, site)
        if found is not None:
            made[cls] = (found[0], _rewritten(found[1], site, form))
    if not made:
        raise NotRewritten("no module of the model has the method that holds the line (a function of its own?)")
    return made


def why_not_rewritten(model: torch.nn.Module, site: Site, form: WhereForm) -> str | None:
    """Why the branch cannot be timed as ``torch.where`` on ``model`` (None: it can); ``model`` is left as it is."""
    try:
        _rewrites(model, site, form)
    except NotRewritten as why:
        return str(why)
    return None


def with_where(model: torch.nn.Module, site: Site, form: WhereForm) -> torch.nn.Module:
    """``model`` (a copy: changed in place) with the method that holds the break's line rewritten on every instance
    of its class; NotRewritten where no module's method holds it or it cannot be rewritten."""
    made = _rewrites(model, site, form)
    for module in model.modules():
        if type(module) in made:
            name, function = made[type(module)]
            setattr(module, name, types.MethodType(function, module))  # this instance only, not its class
    return model
