"""A Python ``if`` on a tensor's value, written as ``torch.cond``: what the compile-graph-break rule times for a
data-dependent branch whose sides are not one ``torch.where`` (several statements, several names set).

Not a rule (the leading ``_`` keeps it out of the rule registry).

Each side becomes a function of the names it must be handed (those it reads before setting them, and those the other
side sets and it leaves as they are); what a side returns that can be (a view of) a tensor it did not make is
returned as a copy, since ``torch.cond`` may not return its inputs; both return
the names the method reads after the ``if`` (or each side ends in a ``return``). The other names a side reads come
from the method's scope, as closures, which ``torch.cond`` allows. Only the side taken runs. Sides that change
state outside themselves (an attribute, an element, a tensor in place), or leave the method early, are not read:
``torch.cond``'s sides may do neither.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from typing import Iterator

TRUE_FN, FALSE_FN = "_if_true", "_if_false"  # the sides' functions in the rewrite
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)  # fmt: skip
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


@dataclass(frozen=True)
class CondForm:
    """The ``if`` at a break's line as one ``torch.cond``: each side's statements (unparsed, ``+=`` written out),
    the names both sides are handed (``operands``) and the names they return (``outputs``; empty where each side
    returns), each side's return expression."""

    test: str
    sides: tuple[tuple[str, ...], tuple[str, ...]]
    operands: tuple[str, ...]
    outputs: tuple[str, ...]
    returned: tuple[str, str]

    label = "torch.cond"

    def code(self, torch_name: str = "torch") -> str:
        """The statements that replace the ``if``, torch named ``torch_name``."""
        lines: list[str] = []
        params = ", ".join(self.operands)
        for name, body, returned in zip((TRUE_FN, FALSE_FN), self.sides, self.returned):
            lines.append(f"def {name}({params}):")
            lines += [f"    {line}" for statement in body for line in statement.splitlines()]
            lines.append(f"    return {returned}")
        operands = f"({params}{',' if len(self.operands) == 1 else ''})"
        call = f"{torch_name}.cond({self.test}, {TRUE_FN}, {FALSE_FN}, {operands})"
        lines.append(f"return {call}" if not self.outputs else f"{', '.join(self.outputs)} = {call}")
        return "\n".join(lines)


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and what it holds, not entering a nested scope (a function, a class, a comprehension)."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, _SCOPES):
            yield from _walk(child)


def _names(nodes: list[ast.stmt], context: type) -> set[str]:
    return {n.id for s in nodes for n in _walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, context)}


class _PlusEquals(ast.NodeTransformer):
    """``h += e`` as ``h = h + e``: inside a side, ``+=`` would change a handed-in tensor in place."""

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST:
        if not isinstance(node.target, ast.Name):
            return node
        read = ast.Name(node.target.id, ast.Load())
        return ast.copy_location(ast.Assign([node.target], ast.BinOp(read, node.op, node.value)), node)


def _why_not_a_side(body: list[ast.stmt]) -> str | None:
    """Why a side cannot be a ``torch.cond`` function (None: it can)."""
    for statement in body:
        for n in _walk(statement):
            if isinstance(n, (ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom, ast.Await)):
                return f"a side has `{ast.unparse(n)}`"
            if isinstance(n, (ast.Break, ast.Continue)):
                return f"a side leaves a loop (`{ast.unparse(n)}`)"
            targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else []
            if isinstance(n, (ast.AugAssign, ast.AnnAssign)):
                targets = [n.target]
            for target in targets:
                if isinstance(target, (ast.Attribute, ast.Subscript)) or isinstance(n, ast.Delete):
                    return f"a side changes `{ast.unparse(target)}`, outside itself"
            call = n.func if isinstance(n, ast.Call) else None
            if isinstance(call, ast.Attribute) and call.attr.endswith("_") and not call.attr.endswith("__"):
                return f"a side changes a tensor in place (`{ast.unparse(n)}`)"
    return None


def _loads_before_stores(body: list[ast.stmt]) -> set[str]:
    """Names a side reads before it sets them, one top-level statement at a time (a statement that reads and sets
    a name reads it first)."""
    seen: set[str] = set()
    first: set[str] = set()
    for statement in body:
        first |= _names([statement], ast.Load) - seen
        seen |= _names([statement], ast.Store)
    return first


def _returns(body: list[ast.stmt]) -> ast.expr | None | bool:
    """A side's returned expression where it ends in its only ``return``; False where it has no return; None where
    it returns in another way (early, bare)."""
    returns = [n for s in body for n in _walk(s) if isinstance(n, ast.Return)]
    if not returns:
        return False
    last = body[-1]
    if returns == [last] and isinstance(last, ast.Return) and last.value is not None:
        return last.value
    return None


# Tensor methods whose result can share the tensor's memory: a side that returns one (or its input as it is)
# returns a copy, since torch.cond may not return what it reads.
_VIEWS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "transpose", "t", "permute", "squeeze", "unsqueeze", "expand",
    "expand_as", "narrow", "select", "flatten", "unflatten", "contiguous", "detach", "as_strided", "chunk",
    "split", "unbind", "movedim", "swapaxes", "diagonal", "real", "imag", "type_as", "to", "float", "half",
    "bfloat16", "double",
})  # fmt: skip


def _last_values(side: list[ast.stmt]) -> dict[str, ast.expr]:
    """Per name a side sets by a plain top-level ``name = value``, the last value; names set another way are left
    out (and read as new tensors)."""
    last: dict[str, ast.expr] = {}
    for statement in side:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
            if isinstance(target, ast.Name):
                last[target.id] = statement.value
    return last


def _may_alias(
    expr: ast.expr, set_here: set[str], last: dict[str, ast.expr], seen: frozenset[str] = frozenset()
) -> bool:
    """Whether a side's returned ``expr`` can be (a view of) a tensor the side did not make."""
    if isinstance(expr, ast.Name):
        if expr.id not in set_here:
            return True  # handed in, or read from the method's scope
        value = last.get(expr.id)
        return value is not None and expr.id not in seen and _may_alias(value, set_here, last, seen | {expr.id})
    if isinstance(expr, (ast.Subscript, ast.Attribute)):
        return True
    call = expr.func if isinstance(expr, ast.Call) else None
    return isinstance(call, ast.Attribute) and call.attr in _VIEWS


def _returned(expr: ast.expr, side: list[ast.stmt]) -> str:
    """A side's returned expression, copied where it can alias what the side read."""
    text = ast.unparse(expr)
    if not _may_alias(expr, _names(side, ast.Store), _last_values(side)):
        return text
    return (
        f"{text}.clone()"
        if isinstance(expr, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
        else f"({text}).clone()"
    )


def live_after(function: ast.AST, node: ast.If) -> set[str]:
    """Names ``function`` reads after ``node``: on later lines, or anywhere in a loop that holds it."""
    end = node.end_lineno or node.lineno
    names = [n for n in _walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    later = {n.id for n in names if n.lineno > end}
    for loop in (n for n in _walk(function) if isinstance(n, _LOOPS)):
        if loop.lineno < node.lineno and end <= (loop.end_lineno or loop.lineno):
            later |= _names(loop.body, ast.Load)
    return later


def cond_form(node: ast.If, function: ast.AST | None) -> CondForm | str:
    """``node`` as one ``torch.cond`` (``function``: the one that holds it, for the names read after it; None:
    every name a side sets is returned), or why it cannot be one."""
    for side in (node.body, node.orelse):
        why = _why_not_a_side(side)
        if why is not None:
            return why
    ends = (_returns(node.body), _returns(node.orelse))
    if ends[0] is None or ends[1] is None:
        return "a side returns before its end"
    # on copies: the caller's tree is the source index's, shared
    sides = [[_PlusEquals().visit(copy.deepcopy(s)) for s in side] for side in (node.body, node.orelse)]
    read_first = [_loads_before_stores(side) for side in sides]
    set_names = [_names(side, ast.Store) for side in sides]
    test = ast.unparse(node.test)
    if isinstance(ends[0], ast.expr) and isinstance(ends[1], ast.expr):
        operands = sorted((read_first[0] & set_names[0]) | (read_first[1] & set_names[1]))
        kept = (tuple(ast.unparse(s) for s in sides[0][:-1]), tuple(ast.unparse(s) for s in sides[1][:-1]))
        returned = (_returned(ends[0], sides[0][:-1]), _returned(ends[1], sides[1][:-1]))
        return CondForm(test, kept, tuple(operands), (), returned)
    if ends[0] is not False or ends[1] is not False:
        return "one side returns and the other goes on"
    outputs = [name for name in _ordered_stores(sides) if function is None or name in live_after(function, node)]
    if not outputs:
        return "neither side sets a name the code after it reads"
    passed = {name for name in outputs if name not in set_names[0] or name not in set_names[1]}
    operands = sorted(passed | ((read_first[0] | read_first[1]) & (set_names[0] | set_names[1])))
    number = _a_number_before(function, node, operands) if function is not None else None
    if number is not None:
        return number
    taken, other = (", ".join(_returned(ast.Name(n, ast.Load()), side) for n in outputs) for side in sides)
    statements = (tuple(ast.unparse(s) for s in sides[0]), tuple(ast.unparse(s) for s in sides[1]))
    if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):  # an elif: a torch.cond of its own, nested
        inner = cond_form(node.orelse[0], function)
        if isinstance(inner, str):
            return f"its elif cannot be one: {inner}"
        statements = (statements[0], (inner.code(),))
    return CondForm(test, statements, tuple(operands), tuple(outputs), (taken, other))


def _a_number_before(function: ast.AST, node: ast.If, operands: list[str]) -> str | None:
    """An operand the function last set to a Python number before the branch, said; torch.cond hands in and returns
    tensors only."""
    last: dict[str, ast.Assign] = {}
    for n in sorted((n for n in _walk(function) if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
        if n.lineno < node.lineno and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            last[n.targets[0].id] = n
    for name in operands:
        assigned = last.get(name)
        value = assigned.value if assigned is not None else None
        if isinstance(value, ast.UnaryOp):
            value = value.operand
        if assigned is not None and isinstance(value, ast.Constant) and isinstance(value.value, (int, float)):
            return (
                f"`{name}` is a Python number where the branch starts (`{ast.unparse(assigned)}`, line "
                f"{assigned.lineno}) and torch.cond hands in and returns tensors only: make it a tensor "
                f"(`{name} = torch.tensor({ast.unparse(assigned.value)})`) to time it"
            )
    return None


def _ordered_stores(sides: list[list[ast.stmt]]) -> list[str]:
    """The names the sides set, in the order they are first set."""
    order: dict[str, None] = {}
    for side in sides:
        for statement in side:
            for n in _walk(statement):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    order.setdefault(n.id, None)
    return list(order)
