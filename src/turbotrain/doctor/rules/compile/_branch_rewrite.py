"""A data-dependent branch in a compiled module's method, rewritten on a copy of the model so that its trial can time
it: as one ``torch.where`` where its shape says the same thing (:mod:`._branch_where`), as ``torch.cond`` otherwise
(:mod:`._branch_cond`).

Not a rule (the leading ``_`` keeps it out of the rule registry). The method is rewritten per instance of a copy of
the model, never on its class, compiled at the line of the ``if`` (torch's messages keep naming the user's file).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from typing import TYPE_CHECKING, Union

import torch

from ._branch_cond import CondForm, cond_form
from ._branch_where import WhereForm, where_form

if TYPE_CHECKING:
    from ...analysis.source import SourceIndex
    from ...sites import Site

BranchForm = Union[WhereForm, CondForm]


def branch_form(node: ast.If, function: ast.AST | None) -> BranchForm | str:
    """``node`` as one ``torch.where`` where it says the same thing, else as ``torch.cond``; or why neither fits.
    ``function``: the one that holds ``node`` (the names read after it)."""
    return where_form(node) or cond_form(node, function)


def _if_at(tree: ast.AST, line: int) -> ast.If | None:
    """The ``if`` whose test is on ``line`` (where torch reports the break)."""
    return next(
        (n for n in ast.walk(tree) if isinstance(n, ast.If) and n.test.lineno <= line <= (n.test.end_lineno or line)),
        None,
    )


def form_at(index: SourceIndex, line: int) -> BranchForm | str | None:
    """The ``if`` at a break's line, inside a function, as :func:`branch_form` reads it; None where no ``if`` of a
    function is there."""
    node = _if_at(index.tree, line)
    function = index.enclosing_function(node) if node is not None else None
    return branch_form(node, function) if node is not None and function is not None else None


def _innermost_function(tree: ast.AST, node: ast.If) -> ast.AST | None:
    """The function of ``tree`` that most closely holds ``node``."""
    end = node.end_lineno or node.lineno
    holding = [
        f
        for f in ast.walk(tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        and f.lineno < node.lineno
        and end <= (f.end_lineno or f.lineno)
    ]
    return max(holding, key=lambda f: f.lineno, default=None)


class NotRewritten(Exception):
    """The branch cannot be rewritten on the model; the message says why, for the finding's note."""


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


def _at_line(statements: list[ast.stmt], line: int) -> list[ast.stmt]:
    """``statements`` placed on ``line``, every node of them."""
    for statement in statements:
        for node in ast.walk(statement):
            if "lineno" in node._attributes:
                node.lineno = node.end_lineno = line  # type: ignore[attr-defined]  # a located node
    return statements


def _rewritten(function: types.FunctionType, site: Site, form: BranchForm) -> types.FunctionType:
    """``function`` with its ``if`` at the break's line as ``form`` says, compiled at the line of the ``if``."""
    if function.__code__.co_freevars:
        raise NotRewritten(f"{function.__qualname__} uses variables of an enclosing scope (super(), a closure)")
    lines, first = inspect.getsourcelines(function)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    ast.increment_lineno(tree, first - 1)
    [defined] = tree.body
    if not isinstance(defined, ast.FunctionDef) or defined.decorator_list:
        raise NotRewritten(f"{function.__qualname__} is decorated")
    branch = _if_at(defined, site.line)
    if branch is None or branch_form(branch, _innermost_function(defined, branch)) != form:
        raise NotRewritten(f"the source of {function.__qualname__} changed since the run")
    # torch as the method's module names it; torch.compile reads a function's globals through its module, so the
    # rewritten method keeps the module's own globals, with nothing added
    torch_name = next((name for name, value in function.__globals__.items() if value is torch), None)
    if torch_name is None and isinstance(form, CondForm):
        raise NotRewritten(f"the module of {function.__qualname__} does not import torch by a name")
    statements = _at_line(ast.parse(form.code(torch_name)).body, branch.lineno)  # type: ignore[arg-type]  # checked above

    class Swap(ast.NodeTransformer):
        def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt]:
            return statements if node is branch else self.generic_visit(node)

    module = ast.fix_missing_locations(Swap().visit(tree))
    namespace: dict[str, object] = {}
    exec(compile(module, site.file, "exec"), {}, namespace)  # noqa: S102 - the user's own method, its branch rewritten
    made = namespace[defined.name]
    assert isinstance(made, types.FunctionType)
    rewritten = types.FunctionType(made.__code__, function.__globals__, function.__name__, function.__defaults__)
    rewritten.__kwdefaults__ = function.__kwdefaults__
    return rewritten


def _rewrites(model: torch.nn.Module, site: Site, form: BranchForm) -> dict[type, tuple[str, types.FunctionType]]:
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


def why_not_rewritten(model: torch.nn.Module, site: Site, form: BranchForm) -> str | None:
    """Why the branch cannot be rewritten on ``model`` (None: it can); ``model`` is left as it is."""
    try:
        _rewrites(model, site, form)
    except NotRewritten as why:
        return str(why)
    return None


def with_rewrite(model: torch.nn.Module, site: Site, form: BranchForm) -> torch.nn.Module:
    """``model`` (a copy: changed in place) with the method that holds the break's line rewritten on every instance
    of its class; NotRewritten where no module's method holds it or it cannot be rewritten."""
    made = _rewrites(model, site, form)
    for module in model.modules():
        if type(module) in made:
            name, function = made[type(module)]
            setattr(module, name, types.MethodType(function, module))  # this instance only, not its class
    return model
