"""The edit that runs a step's batch as micro-batches with gradient accumulation: the statements from the training
forward through its backward run once per micro-batch, each backward of the loss over their number, so that the
gradients autograd sums are the whole batch's (for a loss that is a mean over the batch's rows) while a forward
holds one micro-batch's activations."""

from __future__ import annotations

from typing import Callable, Iterable, cast

import libcst as cst

from ..cst_tools import Source, callee, code_of, replace
from .model import ByHand, EditRequest
from .statements import trains

__all__ = ["micro_batches"]

_SUFFIX = "_micro"


def _assigned(statement: cst.CSTNode) -> set[str]:
    """The plain names a statement (or a ``for`` target) binds: ``x, y = ...`` binds x and y."""
    names: set[str] = set()

    def add(target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            names.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                add(element.value)

    if isinstance(statement, cst.For):
        add(statement.target)
    elif isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    add(target.target)
    return names


def _call_args(statements: Iterable[cst.CSTNode]) -> set[str]:
    """Plain names passed to a call in ``statements``: ``model(x)``, ``loss_fn(out, y)``."""
    found: set[str] = set()

    class _Args(cst.CSTVisitor):
        def visit_Arg(self, arg: cst.Arg) -> None:
            if isinstance(arg.value, cst.Name):
                found.add(arg.value.value)

    for statement in statements:
        statement.visit(_Args())
    return found


class _Rename(cst.CSTTransformer):
    """Loads of the batch's names, not attribute names or keywords that happen to share them."""

    def __init__(self, names: dict[str, str]) -> None:
        super().__init__()
        self.names = names

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        return updated.with_changes(value=self.names[updated.value]) if updated.value in self.names else updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)


def _backward_of(statement: cst.CSTNode) -> str | None:
    """``loss`` for the statement ``loss.backward()``, else None."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return None
    expr = statement.body[0]
    call = expr.value if isinstance(expr, cst.Expr) else None
    if not isinstance(call, cst.Call) or call.args or not isinstance(call.func, cst.Attribute):
        return None
    if call.func.attr.value != "backward" or not isinstance(call.func.value, cst.Name):
        return None
    return call.func.value.value


def _callees(node: cst.CSTNode) -> list[str]:
    """The name each call in ``node`` calls (``zero_grad`` for ``opt.zero_grad()``)."""
    calls: list[str] = []

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            calls.append(callee(call))

    node.visit(_Calls())
    return calls


def _only_zero_grad(statement: cst.CSTNode) -> bool:
    calls = _callees(statement)
    return bool(calls) and all(c == "zero_grad" for c in calls)


def _accumulation_loop(source: Source, forward: cst.CSTNode) -> cst.For | None:
    """The ``for ... in range(N)`` around the forward whose body runs a backward and no optimizer step: a loop in
    which the script already accumulates gradients over micro-steps (nanoGPT's ``for micro_step in
    range(gradient_accumulation_steps)``)."""
    loop = next((a for a in source.ancestors(forward) if isinstance(a, cst.For)), None)
    if loop is None or not isinstance(loop.iter, cst.Call) or callee(loop.iter) != "range" or not loop.iter.args:
        return None
    called = _callees(loop.body)
    return loop if "backward" in called and "step" not in called else None


def _by_hand(req: EditRequest, why: str) -> ByHand:
    return ByHand(f"{req.where}: {why}; split the batch into micro-batches by hand")


def micro_batches(source: Source, req: EditRequest) -> str:
    """``for x_micro, y_micro in zip(x.chunk(k), y.chunk(k)):`` around the training forward through its backward
    (``params``: ``k``, the micro-batches; ``dim``, the batch's dimension); the backward of ``loss / k``; a
    ``zero_grad`` between them moved before the loop (inside, it would clear what the earlier micro-batches left)."""
    k, dim = int(req.params["k"]), int(req.params.get("dim", 0))
    first = source.statement_line(req.line)
    if not isinstance(first, cst.SimpleStatementLine) or trains(first):
        raise _by_hand(req, "the forward is not a statement of its own before the backward")
    owner, body = source.block_of(first)
    loop = source.parent(owner)
    if not isinstance(loop, cst.For):
        accumulating = _accumulation_loop(source, first)
        if accumulating is not None:
            bounds = [code_of(a.value) for a in cast(cst.Call, accumulating.iter).args]  # _accumulation_loop checked
            times = f" ({bounds[0]} x {k})" if len(bounds) == 1 else ""  # range(N): N micro-steps
            line = source.lines(accumulating)[0]
            raise ByHand(
                f"{req.where}: the forward already runs in a loop that accumulates gradients (`for ... in "
                f"range({', '.join(bounds)})`, {source.name}:{line}): give it {k} times the micro-steps{times} of "
                f"batches {k} times smaller where the script sets them"
            )
        raise _by_hand(req, "the forward is not directly inside the training `for` loop")
    statements = list(body)
    start = statements.index(first)
    run, hoisted, loss = [], [], None
    for statement in statements[start:]:
        loss = _backward_of(statement)
        if loss is not None:
            run.append(statement)
            break
        if not isinstance(statement, cst.SimpleStatementLine):
            raise _by_hand(req, "a compound statement comes between the forward and `loss.backward()`")
        if _only_zero_grad(statement):
            hoisted.append(statement)
        elif trains(statement):
            raise _by_hand(req, "the backward is not `loss.backward()` on a name")
        else:
            run.append(statement)
    if loss is None:
        raise _by_hand(req, "no `loss.backward()` after the forward in the same block")
    known = _assigned(loop).union(*(_assigned(s) for s in statements[:start]))
    # The batch: what the forward and the loss's own statement pass to calls (a `print(step)` between them is not).
    feeding = [run[0], *(s for s in run[1:-1] if loss in _assigned(s))]
    batch = sorted(known & _call_args(feeding))
    if not batch:
        raise _by_hand(req, "no batch made in the loop is passed to the forward")
    taken = {n.value for n in source.nodes(cst.Name)}
    renamed = {name: name + _SUFFIX for name in batch}
    if taken & set(renamed.values()):
        raise _by_hand(req, f"the name {', '.join(sorted(taken & set(renamed.values())))} is taken")
    rename = _Rename(renamed)
    inside: list[cst.BaseStatement] = [cast(cst.SimpleStatementLine, s.visit(rename)) for s in run[:-1]]
    inside.append(cst.parse_statement(f"({loss} / {k}).backward()\n"))
    axis = f", dim={dim}" if dim else ""
    chunks = [f"{name}.chunk({k}{axis})" for name in batch]
    targets = ", ".join(renamed[name] for name in batch)
    source_of = chunks[0] if len(chunks) == 1 else f"zip({', '.join(chunks)})"
    head = cst.parse_statement(f"for {targets} in {source_of}:\n    pass\n")
    assert isinstance(head, cst.For)  # parsed from a for statement
    comment = cst.EmptyLine(comment=cst.Comment(f"# {k} micro-batches: their gradients add up to the whole batch's"))
    leading = [*first.leading_lines, comment]
    micro = head.with_changes(body=cst.IndentedBlock(body=[inside[0].with_changes(leading_lines=()), *inside[1:]]))
    edits: dict[cst.CSTNode, Callable[[cst.CSTNode], object]] = {}
    before = [s.with_changes(leading_lines=()) for s in hoisted]
    edits[first] = lambda _: cst.FlattenSentinel([*before, micro.with_changes(leading_lines=leading)])
    for statement in [*run[1:], *hoisted]:
        edits[statement] = lambda _: cst.RemoveFromParent()
    return replace(source, edits)
