"""A Python ``if`` on a tensor's value, written as one ``torch.where``: what the compile-graph-break rule times for a
data-dependent branch that says the same thing as one.

Not a rule (the leading ``_`` keeps it out of the rule registry).

Only the shapes that say the same thing as one ``torch.where`` are read: each side sets one and the same name
(``if c: h = a`` with an ``else: h = b``, or none: ``h`` kept), or each side returns (``if c: return a`` and
``else: return b``). ``torch.where`` computes both sides, so the trial times what the rewrite costs as well as the
graph break it saves.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class WhereForm:
    """The ``if`` at a break's line, as one ``torch.where``: ``target`` (None: the branch returns) gets
    ``where(test, taken, other)``."""

    test: str
    taken: str
    other: str
    target: str | None

    label = "torch.where"

    def code(self, torch_name: str | None = "torch") -> str:
        """The statement that replaces the ``if``, torch named ``torch_name``; None: as the method of the tensor the
        taken side makes."""
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
