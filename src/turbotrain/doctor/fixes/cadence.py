"""Cadence edits: validation or checkpoints every N steps instead of every few, and a per-step
``torch.save`` put under ``if (step + 1) % N == 0:``."""

from __future__ import annotations

import re
from typing import cast

import libcst as cst

from ..analysis.branch import RANK_TEST
from ..cst_tools import Source, callee, code_of, dotted, replace
from .model import ByHand, EditRequest

__all__ = ["periodic", "save_every"]


def _constant(source: Source, name: str) -> cst.Assign | None:
    """The one top-level ``NAME = <int>`` of the file, if ``name`` is bound exactly so."""
    found = [
        node
        for stmt in source.module.body
        if isinstance(stmt, cst.SimpleStatementLine)
        for node in stmt.body
        if isinstance(node, cst.Assign)
        and any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets)
    ]
    others = [n for n in source.nodes(cst.AssignTarget) if isinstance(n.target, cst.Name) and n.target.value == name]
    if len(found) == 1 and len(others) == 1 and isinstance(found[0].value, cst.Integer):
        return found[0]
    return None


def _divisors(source: Source, test: cst.BaseExpression) -> list[cst.BaseExpression]:
    out = []

    class _Find(cst.CSTVisitor):
        def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
            if isinstance(node.operator, cst.Modulo):
                out.append(node.right)

    test.visit(_Find())
    return out


def _runs_there(source: Source, node: cst.If, req: EditRequest) -> bool:
    """The ``if``'s body holds the finding's line, a call of the function holding it, or a torch.save."""
    first, last = source.lines(node.body)
    if first <= req.line <= last:
        return True
    wanted = req.params.get("function")
    found = []

    class _Find(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            name = callee(call)
            if (wanted and name == wanted) or (req.params.get("kind") == "checkpoint" and name == "save"):
                found.append(call)

    node.body.visit(_Find())
    return bool(found)


def periodic(source: Source, req: EditRequest) -> str:
    """The ``N`` of the ``if step % N == 0:`` that runs the validation (or checkpoint), set to the cadence that
    keeps it under 5% of training time: in the test itself, or in the one top-level ``N = <int>`` it names."""
    every, new_every = req.params["every"], req.params["new_every"]
    candidates: list[tuple[cst.If, cst.BaseExpression]] = []
    for node in source.nodes(cst.If):
        if not _runs_there(source, node, req):
            continue
        for divisor in _divisors(source, node.test):
            if isinstance(divisor, cst.Integer) and int(divisor.value) == every:
                candidates.append((node, divisor))
            elif not isinstance(divisor, cst.Integer):
                constant = _constant(source, divisor.value) if isinstance(divisor, cst.Name) else None
                # _constant returns only ``NAME = <int>``
                if constant is None or int(cast(cst.Integer, constant.value).value) != every:
                    raise ByHand(
                        f"{source.name}:{source.lines(node)[0]}: `{code_of(node.test)}` takes its period "
                        f"from `{code_of(divisor)}`, which is not one top-level integer; set it to "
                        f"{new_every} where it is made"
                    )
                candidates.append((node, constant.value))
    if len({id(c[1]) for c in candidates}) != 1:
        why = "no" if not candidates else "more than one"
        raise ByHand(
            f"{req.where}: {why} `if step % {every} ...` runs this {req.params.get('kind', 'work')}; "
            f"change its period to {new_every} steps by hand"
        )
    _, value = candidates[0]
    return replace(source, {value: lambda node: node.with_changes(value=str(new_every))})


_COUNTER = re.compile(r"^(i|it|n|idx|index|step|steps|iteration|iter_num|\w*_step|step_\w*|\w*_iter)$")


def _counter(loop: cst.For) -> str | None:
    """The loop's step counter: ``step`` of ``for step in range(...)`` (or of any iterable, for a counter's
    name) or of ``for step, batch in enumerate(...)``; ``for batch in loader`` has none: a batch is not a number."""
    if isinstance(loop.target, cst.Name) and (
        (isinstance(loop.iter, cst.Call) and dotted(loop.iter.func) == "range") or _COUNTER.match(loop.target.value)
    ):
        return loop.target.value
    if (
        isinstance(loop.target, cst.Tuple)
        and isinstance(loop.iter, cst.Call)
        and dotted(loop.iter.func) == "enumerate"
        and isinstance(loop.target.elements[0].value, cst.Name)
    ):
        return loop.target.elements[0].value.value
    return None


def save_every(source: Source, req: EditRequest) -> str:
    """``if (step + 1) % N == 0:`` around the ``torch.save`` (or the call ``params["call"]`` names) that runs
    every step."""
    name = req.params.get("call", "save")
    call = source.call_at(req.line, name, what="torch.save(...)" if name == "save" else f"{name}(...)")
    statement = source.statement(call)
    loop = None
    for node in source.ancestors(statement):
        # Only a rank test (``if rank == 0:``) keeps the save with the cadence inside it: under any other
        # condition (``if val_loss < best:``) a cadence would drop saves the script means to make.
        if isinstance(node, cst.If) and (_divisors(source, node.test) or not RANK_TEST.search(code_of(node.test))):
            raise ByHand(f"{req.where}: the call is already under a condition; make it rarer there")
        if isinstance(node, (cst.For, cst.While, cst.FunctionDef)):
            loop = node
            break
    if not isinstance(loop, cst.For) or _counter(loop) is None:
        raise ByHand(
            f"{req.where}: no step counter in the loop around the call; run it every {req.params['every']} "
            "steps with a counter of your own"
        )
    every = req.params["every"]
    test = cst.parse_expression(f"({_counter(loop)} + 1) % {every} == 0")
    leading = getattr(statement, "leading_lines", ())
    guarded = cst.If(
        test=test, body=cst.IndentedBlock(body=[statement.with_changes(leading_lines=())]), leading_lines=leading
    )
    return replace(source, {statement: lambda _: guarded})
