"""`non-foreach-update`: a Python loop over a model's parameters that updates each tensor in place every step (an
EMA of the weights, an SGD step written by hand): one small kernel per tensor and op, where `torch._foreach_*` runs
each op over the whole list in one call; the per-tensor loop against the foreach calls timed on your model's
parameters.

Reads: source + run.
Edit: the loop replaced by one `torch._foreach_<op>_` call per op over lists of the same tensors
(`e.mul_(d).add_(p, alpha=1 - d)` becomes `torch._foreach_mul_(...)` then `torch._foreach_add_(..., alpha=1 - d)`;
`p -= lr * p.grad` becomes `torch._foreach_sub_(..., torch._foreach_mul(..., lr))`): the same ops on the same
tensors, bitwise on a CPU; by hand where the loop does anything else.

A loop counts when it iterates ``X.parameters()`` (or ``zip`` of several, or ``list`` of it) and its body only
updates the loop's tensors in place: a chain of in-place methods (``add_``, ``sub_``, ``mul_``, ``div_``,
``lerp_``, ``copy_``, ``addcmul_``) or an augmented assignment, whose tensor arguments are the loop's tensors (or
their ``.data``/``.grad``) and whose other arguments do not depend on them. It must run every step: inside the loop
that calls ``backward()``/``step()``, or in a function seen running during the steps.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

import torch

from ....measure import judge
from ...analysis.replay import fastest_pair
from ...analysis.source import SourceIndex, dotted_name
from ...edits import EXACT, ByHand, EditSpec
from ...findings import Evidence, Finding, Fix
from ...requests import OwnTrial
from ...results import WhatIf
from ..common import ms, sources
from ..rule import Detect, Measured, Rule, TimeLeft, register

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...cst_tools import Source
    from ...edits import EditRequest

ROUNDS = 3  # interleaved rounds of the per-tensor loop and the foreach calls
REPEATS = 5  # the fastest of this many calls each, per round
_METHODS = frozenset({"add_", "sub_", "mul_", "div_", "lerp_", "copy_", "addcmul_"})
_AUG_OPS = {ast.Add: "add_", ast.Sub: "sub_", ast.Mult: "mul_", ast.Div: "div_"}
_STEP_CALLS = ("backward", "step")


@dataclass(frozen=True)
class UpdateEvidence(Evidence):
    iterable: str  # what the loop iterates, as written
    ops: tuple[str, ...]  # each op as a signature over t (a loop tensor) and s (a value): "add_(t, alpha=s)"


@dataclass(frozen=True, kw_only=True)
class ForeachResult(WhatIf):
    """The loop's ops over the model's parameter tensors, one tensor at a time against foreach, interleaved
    (``rounds``: per-tensor / foreach)."""

    kind: ClassVar[str] = "foreach_update"
    tensors: int
    rounds: tuple[float, ...]
    loop_ms: float
    foreach_ms: float

    def _fields(self) -> dict[str, Any]:
        return {
            "tensors": self.tensors,
            "rounds": list(self.rounds),
            "loop_ms": self.loop_ms,
            "foreach_ms": self.foreach_ms,
        }


# -- reading the loop ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Op:
    """One in-place op of the loop body: ``method`` on the tensor ``root`` with ``args`` (each an ast expression,
    and whether it is a loop tensor) and keywords; ``scaled``: an augmented assignment's ``t * s`` operand."""

    root: ast.expr
    method: str
    args: tuple[tuple[ast.expr, bool], ...]
    keywords: tuple[tuple[str, ast.expr], ...] = ()
    scaled: ast.expr | None = None  # the value a loop tensor argument is multiplied by first

    @property
    def signature(self) -> str:
        arg = "t*s" if self.scaled is not None else None
        parts = [arg or ("t" if is_tensor else "s") for _, is_tensor in self.args]
        parts += [f"{k}=s" for k, _ in self.keywords]
        return f"{self.method}({', '.join(parts)})"


def _targets(loop: ast.For) -> tuple[str, ...] | None:
    target = loop.target
    if isinstance(target, ast.Name):
        return (target.id,)
    if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
        return tuple(e.id for e in target.elts if isinstance(e, ast.Name))
    return None


def _parameter_lists(node: ast.expr) -> int:
    """How many ``X.parameters()`` the iterable zips (1 for one alone, inside ``list(...)`` or not); 0 otherwise."""
    if isinstance(node, ast.Call) and dotted_name(node.func) == "list" and len(node.args) == 1:
        return _parameter_lists(node.args[0])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parameters":
        return 1
    if isinstance(node, ast.Call) and dotted_name(node.func) == "zip" and node.args and not node.keywords:
        return len(node.args) if all(_parameter_lists(a) == 1 for a in node.args) else 0
    return 0


def _loop_tensor(node: ast.expr, names: tuple[str, ...]) -> bool:
    """``p``, ``p.data``, ``p.grad``, ``p.grad.data``: a loop tensor, or one it holds."""
    while isinstance(node, ast.Attribute) and node.attr in ("data", "grad"):
        node = node.value
    return isinstance(node, ast.Name) and node.id in names


def _uses(node: ast.AST, names: tuple[str, ...]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _argument(node: ast.expr, names: tuple[str, ...]) -> tuple[ast.expr, bool] | None:
    if _loop_tensor(node, names):
        return node, True
    return (node, False) if not _uses(node, names) else None


def _chain(node: ast.expr, names: tuple[str, ...]) -> list[_Op] | None:
    """``root.m1_(...).m2_(...)``: its ops in order, or None when it is anything else."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _METHODS):
        return None
    receiver = node.func.value
    before = [] if _loop_tensor(receiver, names) else _chain(receiver, names)
    if before is None:
        return None
    found = [_argument(a, names) for a in node.args]
    args = tuple(a for a in found if a is not None)
    keywords = tuple((k.arg, k.value) for k in node.keywords if k.arg is not None)
    if len(args) != len(found) or len(keywords) != len(node.keywords) or any(_uses(v, names) for _, v in keywords):
        return None
    root = before[0].root if before else receiver
    return [*before, _Op(root, node.func.attr, args, keywords)]


def _augmented(node: ast.AugAssign, names: tuple[str, ...]) -> _Op | None:
    """``p -= lr * p.grad`` (``+=``, ``-=``, ``*=``, ``/=``; the operand a loop tensor, a value, or a product)."""
    method = _AUG_OPS.get(type(node.op))
    target = node.target
    if method is None or not _loop_tensor(target, names):
        return None
    value = node.value
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult):
        for tensor, scale in ((value.left, value.right), (value.right, value.left)):
            if _loop_tensor(tensor, names) and not _uses(scale, names):
                return _Op(target, method, ((tensor, True),), scaled=scale)
    found = _argument(value, names)
    return _Op(target, method, (found,)) if found else None


def read_loop(loop: ast.For) -> tuple[tuple[str, ...], list[_Op]] | None:
    """(the loop's names, its body's ops) for a loop over parameters whose body only updates them in place."""
    names = _targets(loop)
    lists = _parameter_lists(loop.iter)
    if names is None or not lists or len(names) != lists or loop.orelse:
        return None
    ops: list[_Op] = []
    for statement in loop.body:
        if isinstance(statement, ast.Expr):
            chain = _chain(statement.value, names)
        elif isinstance(statement, ast.AugAssign):
            one = _augmented(statement, names)
            chain = [one] if one else None
        else:
            chain = None
        if not chain:
            return None
        ops += chain
    return names, ops


def _every_step(ctx: Context, index: SourceIndex, loop: ast.For) -> bool | None:
    """True inside a loop that calls ``backward()``/``step()``; else whether its function was seen running."""
    parent = index.parents.get(loop)
    while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(parent, (ast.For, ast.While)) and any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _STEP_CALLS
            for n in ast.walk(parent)
        ):
            return True
        parent = index.parents.get(parent)
    if parent is None:
        return None  # module level, outside any training loop
    return ctx.function_ran(index.site(loop))


def _sampled(ctx: Context, index: SourceIndex, loop: ast.For) -> bool:
    """Whether the gap sampler caught the loop running in the untimed time before a forward (after
    ``optimizer.step()``, which ends the step: that time is charged to data loading)."""
    lines = range(loop.lineno, (loop.end_lineno or loop.lineno) + 1)
    return any(site.file == index.path and site.line in lines for site in ctx.gap_samples)


def _findings(ctx: Context, sampled: bool) -> Iterator[Finding]:
    for index in sources(ctx):
        for loop in (n for n in ast.walk(index.tree) if isinstance(n, ast.For)):
            read = read_loop(loop)
            if read is None or _sampled(ctx, index, loop) != sampled:
                continue
            if not sampled and not _every_step(ctx, index, loop):
                continue
            iterable = ast.unparse(loop.iter)
            said = ", ".join(sorted({op.method for op in read[1]}))
            f = Finding(
                "non-foreach-update",
                site=index.site(loop),
                # Run between optimizer.step() and the next forward, its time is the data-loading phase's.
                category="data_loading" if sampled else None,
                message=(
                    f"This loop over {iterable} updates the tensors one at a time ({said}): one small kernel, "
                    "and its Python and dispatch cost, per tensor and op, every step."
                    + (" It runs before the next forward, so its time shows as data loading." if sampled else "")
                ),
                fix=Fix(
                    "one torch._foreach_<op>_ call per op over lists of the tensors (torch._foreach_mul_, "
                    "torch._foreach_add_, torch._foreach_lerp_, ...); for an EMA of the weights, "
                    "torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))",
                    lightning="the same foreach calls in the hook that runs the loop (on_train_batch_end)",
                ),
                evidence=UpdateEvidence(iterable=iterable, ops=tuple(op.signature for op in read[1])),
                request=OwnTrial(),
            )
            f.provisional("low")
            yield f


def non_foreach_update_seen(ctx: Context) -> Iterator[Finding]:
    """The loops the run caught running every step (the gap sampler)."""
    return _findings(ctx, sampled=True)


def non_foreach_update(ctx: Context) -> Iterator[Finding]:
    """The loops read in the source that run every step: in the training loop, or in a function seen running."""
    return _findings(ctx, sampled=False)


# -- timing ----------------------------------------------------------------------------------------------------------

_SIGNATURE = re.compile(r"^(\w+)\((.*)\)$")
# The values the timing passes for the loop's own (mul_/div_ by 1 and a small alpha keep the magnitudes as they are).
_VALUES = {"mul_": 1.0, "div_": 1.0, "add_": 0.0, "sub_": 0.0, "lerp_": 0.5, "addcmul_": 0.0}


def _call(signature: str, tensor: torch.Tensor | list[torch.Tensor], other: Any, foreach: bool) -> None:
    """One op of the loop, on one tensor (``other``: the loop's other tensor) or, foreach, on every one."""
    match = _SIGNATURE.match(signature)
    assert match is not None  # written by _Op.signature
    method, parts = match.group(1), [p for p in match.group(2).split(", ") if p]
    value = _VALUES.get(method, 1.0)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for part in parts:
        if "=" in part:
            kwargs[part.split("=")[0]] = 1e-3
        elif part == "t*s":
            args.append(torch._foreach_mul(other, value) if foreach else other * value)
        else:
            args.append(other if part == "t" else value)
    if foreach:
        getattr(torch, f"_foreach_{method}")(tensor, *args, **kwargs)
    else:
        getattr(tensor, method)(*args, **kwargs)


def measure(ctx: Context, finding: Finding, budget: TimeLeft) -> Measured | None:
    """The loop's ops over copies of the model's parameter tensors: one tensor at a time against the foreach calls,
    ``ROUNDS`` interleaved rounds of the fastest of ``REPEATS`` calls each."""
    model = ctx.capture.module if ctx.capture is not None else None
    params = [p for p in model.parameters()] if model is not None else []
    if not params or not budget.allows(2.0):
        return None
    ops = finding.evidence_as(UpdateEvidence).ops
    with torch.no_grad():
        mine = [p.detach().clone() for p in params]
        other = [p.detach().clone() for p in params]

        def per_tensor() -> None:
            for tensor, source in zip(mine, other):
                for signature in ops:
                    _call(signature, tensor, source, foreach=False)

        def foreach() -> None:
            for signature in ops:
                _call(signature, mine, other, foreach=True)

        per_tensor()  # the first calls warm both
        foreach()
        pairs = [fastest_pair(per_tensor, foreach, ctx.on_gpu, REPEATS) for _ in range(ROUNDS)]
    ratios = tuple(round(loop / fast, 3) for loop, fast in pairs if fast > 0)
    loop_s, foreach_s = min(p[0] for p in pairs), min(p[1] for p in pairs)
    return Measured(
        what_if=ForeachResult(
            tensors=len(params), rounds=ratios, loop_ms=round(loop_s * 1e3, 4), foreach_ms=round(foreach_s * 1e3, 4)
        ),
        verdict=judge(ratios, noise_floor=ctx.noise_floor),
        applies_to=min(1.0, loop_s / ctx.step_s) if ctx.step_s > 0 else 0.0,
        note=(
            f"Timed on your model's {len(params)} parameter tensors: {ms(loop_s)} one tensor at a time, "
            f"{ms(foreach_s)} foreach."
        ),
    )


# -- the edit --------------------------------------------------------------------------------------------------------


_TORCH = "__torch__"  # where the statements name torch: the rewrite puts the file's own name for it there


def _list_name(index: SourceIndex, lists: int) -> str:
    taken = {n.id for n in ast.walk(index.tree) if isinstance(n, ast.Name)}
    for name in ("pairs", "foreach_pairs") if lists > 1 else ("params", "foreach_params"):
        if name not in taken:
            return name
    raise ByHand("the names the foreach lists would take are in use in the file; write the foreach calls by hand")


def edit(ctx: Context, f: Finding) -> EditSpec:
    assert f.site is not None  # fixes.choose plans only findings with a site
    index = ctx.sources.get(f.site.file)
    loop = (
        next((n for n in ast.walk(index.tree) if isinstance(n, ast.For) and n.lineno == f.site.line), None)
        if (index)
        else None
    )
    read = read_loop(loop) if loop is not None else None
    if index is None or loop is None or read is None:
        raise ByHand(f"no loop over parameters at {f.site.file}:{f.site.line} (the line changed since the run?)")
    names, ops = read
    if any(op.method == "copy_" and op.keywords for op in ops):
        raise ByHand("copy_(..., non_blocking=...) in the loop: write torch._foreach_copy_ by hand")
    listed = _list_name(index, len(names))
    target = ", ".join(names)  # ast.unparse would write a tuple target in parentheses

    def each(node: ast.expr) -> str:
        return f"[{ast.unparse(node)} for {target} in {listed}]"

    statements = [f"{listed} = list({ast.unparse(loop.iter)})"]
    for op in ops:
        args = []
        for node, is_tensor in op.args:
            if op.scaled is not None:
                args.append(f"{_TORCH}._foreach_mul({each(node)}, {ast.unparse(op.scaled)})")
            else:
                args.append(each(node) if is_tensor else ast.unparse(node))
        args += [f"{k}={ast.unparse(v)}" for k, v in op.keywords]
        statements.append(f"{_TORCH}._foreach_{op.method}({each(op.root)}, {', '.join(args)})")
    label = f"the loop over {ast.unparse(loop.iter)} as {len(ops)} foreach call(s)"
    return EditSpec(
        "rule", label, params={"statements": statements, "iterable": ast.unparse(loop.iter)}, numerics=EXACT
    )


def rewrite(source: Source, req: EditRequest) -> str:
    """The ``for`` statement at the request's line replaced by the planned statements (``torch`` as the file names
    it)."""
    import libcst as cst  # the `fix` extra: imported only where an edit is made

    from ...cst_tools import code_of, replace

    torch_name = source.alias_of("torch")
    if torch_name is None:
        raise ByHand(f"{req.where}: the file does not `import torch`; the foreach calls need it")
    loop = source.statement_line(req.line)
    if not isinstance(loop, cst.For) or ast.unparse(ast.parse(code_of(loop.iter))) != req.params["iterable"]:
        raise ByHand(f"{req.where}: no loop over {req.params['iterable']} here (the line changed since the run?)")
    made = [cst.parse_statement(s.replace(_TORCH, torch_name)) for s in req.params["statements"]]
    made[0] = made[0].with_changes(leading_lines=loop.leading_lines)  # the comments and blank lines above the loop
    header = getattr(loop.body, "header", None)  # the comment after the loop's colon stays on its first line
    if header is not None and header.comment is not None:
        made[0] = made[0].with_changes(trailing_whitespace=header)
    return replace(source, {loop: lambda _: cst.FlattenSentinel(made)})


RULE = register(
    Rule(
        "non-foreach-update",
        detect=(Detect("runtime", non_foreach_update_seen), Detect("static", non_foreach_update)),
        measure=measure,
        edit=edit,
        rewrite=rewrite,
    )
)
