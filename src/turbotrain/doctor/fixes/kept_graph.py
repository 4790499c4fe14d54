"""The edit that stops a loop keeping each step's autograd graph: ``.detach()`` on the value it keeps."""

from __future__ import annotations

import libcst as cst

from ..cst_tools import Source, code_of
from ..cst_tools import replace as replace_nodes
from .model import ByHand, EditRequest

__all__ = ["detach_kept"]

# Container methods whose last positional argument is kept (``extend`` keeps the items of a list: not edited).
_KEEPS = ("append", "insert", "add", "appendleft")
# Already a value without a graph: nothing to detach.
_NO_GRAPH = ("detach", "item", "tolist", "numpy")
# Expressions that take ``.detach()`` without parentheses.
_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript)


def _detached(expr: cst.BaseExpression) -> cst.Call:
    if not isinstance(expr, _ATOMS):
        expr = expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Call(func=cst.Attribute(value=expr, attr=cst.Name("detach")))


def _detach_value(node: cst.CSTNode) -> cst.CSTNode:
    """An argument or an augmented assignment (the updated node) with its value detached."""
    assert isinstance(node, (cst.Arg, cst.AugAssign))  # the only nodes detach_kept hands over
    return node.with_changes(value=_detached(node.value))


def _has_no_graph(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _NO_GRAPH


def _is_holder(node: cst.BaseExpression, holder: str) -> bool:
    """``node`` names the holder the recording saw grow (``losses``, or ``self.losses`` for ``losses``)."""
    text = code_of(node)
    return not holder or text == holder or text.endswith("." + holder)


def detach_kept(source: Source, req: EditRequest) -> str:
    """``holder.append(loss.detach())`` for ``holder.append(loss)``, ``total += (a + b).detach()`` for
    ``total += a + b``, at the line the recording saw the holder grow."""
    holder = str(req.params.get("holder") or "")
    for call in source.calls_at(req.line, *_KEEPS):
        if not isinstance(call.func, cst.Attribute) or not _is_holder(call.func.value, holder):
            continue
        positional = [a for a in call.args if a.keyword is None]
        if not positional or positional[-1].star:
            continue
        kept = positional[-1]
        if _has_no_graph(kept.value):
            raise ByHand(f"{req.where}: `{code_of(call)}` already keeps a value without a graph")
        return replace_nodes(source, {kept: _detach_value})
    for node in source.nodes(cst.AugAssign):
        if (
            source.lines(node)[0] == req.line
            and isinstance(node.operator, cst.AddAssign)
            and _is_holder(node.target, holder)
        ):
            if _has_no_graph(node.value):
                raise ByHand(f"{req.where}: `{code_of(node)}` already adds a value without a graph")
            return replace_nodes(source, {node: _detach_value})
    raise ByHand(
        f"{req.where}: no {holder or 'list'}.append(...) or {holder or 'total'} += ... here to detach; keep "
        "loss.detach() or loss.item() where the loop keeps it"
    )
