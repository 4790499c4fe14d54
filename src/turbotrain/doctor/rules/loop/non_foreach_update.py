"""`non-foreach-update`: a Python loop over a model's parameters that updates each tensor in place in the steps (an
EMA of the weights, a target network's soft update, an SGD step written by hand): one small kernel per tensor and
op, where `torch._foreach_*` runs each op over the whole list in one call; the loop against the foreach calls timed
on your model's parameters.

Reads: source + run.
Edit: the loop replaced by one `torch._foreach_*` call per op over lists of the same tensors
(`e.mul_(d).add_(p, alpha=1 - d)` becomes `torch._foreach_mul_(...)` then `torch._foreach_add_(..., alpha=1 - d)`;
`t.data.copy_(tau * p.data + (1 - tau) * t.data)` becomes `torch._foreach_copy_(...,
torch._foreach_add(torch._foreach_mul(..., tau), torch._foreach_mul(..., 1 - tau)))`; over a state dict,
`t_sd[key] = p_sd[key] * tau + ...` becomes `keys = list(p_sd)` and `torch._foreach_copy_([t_sd[key] for key in keys],
...)`): the same ops on the same tensors, bitwise on a CPU; by hand where the loop does anything else.

A loop counts when it iterates ``X.parameters()`` (or ``zip`` of several, or ``list`` of it) and its body only
updates the loop's tensors, or when it iterates the keys (or items) of a dict the file binds to ``X.state_dict()``
and its body only sets ``sd[key] = <value>`` for such dicts (a target network's soft update; the state dict's
tensors share storage with X's, so copying in place is what ``load_state_dict`` then does): chains of in-place
methods (``add_``, ``sub_``, ``mul_``, ``div_``, ``lerp_``, ``copy_``, ``addcmul_``), augmented assignments (``+=``,
``-=``, ``*=``, ``/=``) or ``x.data = ...``, whose values are the loop's tensors (``p``, ``p.data``, ``p.grad``,
``p.detach()``, ``sd[key]``), values that do not depend on them, and ``+``, ``-``, ``*``, ``/``, unary ``-`` and the
methods ``add``, ``sub``, ``mul``, ``div``, ``lerp`` of those. It must run in the steps: inside the loop that calls
``backward()``/``step()``, in a function seen running during the steps, or caught running by the gap sampler. Under
``if step % N == 0:`` (in the training loop, or around the call of the function that holds it) it runs every N
steps, and its gain counts once in N; where N is a name the run did not show, the loop is named but not timed.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, cast

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
    from ...sites import Site

ROUNDS = 3  # interleaved rounds of the per-tensor loop and the foreach calls
REPEATS = 5  # the fastest of this many calls each, per round
_IN_PLACE = frozenset({"add_", "sub_", "mul_", "div_", "lerp_", "copy_", "addcmul_"})
_OUT_OF_PLACE = frozenset({"add", "sub", "mul", "div", "lerp"})
_BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
_STEP_CALLS = ("backward", "step")
_TORCH = "__torch__"  # where generated code names torch: the edit puts the file's own name for it there


@dataclass(frozen=True)
class UpdateEvidence(Evidence):
    iterable: str  # what the loop iterates, as written
    methods: tuple[str, ...]  # the in-place updates it makes, in order: "mul_", "add_", "copy_", ...
    every: int | None = 1  # steps between its runs (``if step % N == 0:``); None: a period the run did not show


@dataclass(frozen=True, kw_only=True)
class ForeachResult(WhatIf):
    """The loop over the model's parameter tensors, one tensor at a time against its foreach calls, interleaved
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
class _Update:
    """One in-place update of a loop tensor: ``target`` gets ``method`` (in place) with ``args`` and ``keywords``."""

    target: ast.expr
    method: str
    args: tuple[ast.expr, ...]
    keywords: tuple[tuple[str, ast.expr], ...] = ()


@dataclass(frozen=True)
class _Loop:
    """A loop over parameters whose body is only in-place updates of its tensors; or over a state dict's keys whose
    body only gives each key of the state dicts ``dicts`` a value made from theirs."""

    node: ast.For
    names: tuple[str, ...]
    updates: tuple[_Update, ...]
    dicts: tuple[str, ...] = ()

    def is_ref(self, node: ast.expr) -> bool:
        """``p``, ``p.data``, ``p.grad``, ``p.detach()`` and their like: a loop tensor, or one it holds; ``sd[key]``
        for a state dict of the loop's."""
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id in self.dicts
            and isinstance(node.slice, ast.Name)
            and node.slice.id in self.names
        ):
            return True
        while True:
            if isinstance(node, ast.Attribute) and node.attr in ("data", "grad"):
                node = node.value
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "detach"
                and not (node.args or node.keywords)
            ):
                node = node.func.value
            else:
                return isinstance(node, ast.Name) and node.id in self.names

    def is_scalar(self, node: ast.expr) -> bool:
        return not any(isinstance(n, ast.Name) and n.id in self.names for n in ast.walk(node))

    def is_tensor(self, node: ast.expr) -> bool:
        """A value foreach can make from the loop's tensors (see the module's docstring)."""
        if self.is_ref(node):
            return True
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return self.is_tensor(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = (
                (self.is_tensor(node.left), self.is_scalar(node.left)),
                (
                    self.is_tensor(node.right),
                    self.is_scalar(node.right),
                ),
            )
            if not (any(left) and any(right)) or (left[1] and right[1]):
                return False
            # a value over a tensor has no foreach form that rounds the same
            return not (isinstance(node.op, ast.Div) and left[1])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _OUT_OF_PLACE:
            return self.is_tensor(node.func.value) and self._arguments_fit(node)
        return False

    def _arguments_fit(self, call: ast.Call) -> bool:
        return all(self.is_tensor(a) or self.is_scalar(a) for a in call.args) and all(
            k.arg is not None and self.is_scalar(k.value) for k in call.keywords
        )


def _names(loop: ast.For) -> tuple[str, ...] | None:
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


def _state_dicts(index: SourceIndex) -> frozenset[str]:
    """The names the file binds to ``X.state_dict()``: dicts whose tensors share storage with X's."""
    return frozenset(
        t.id
        for n in ast.walk(index.tree)
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.Call)
        and isinstance(n.value.func, ast.Attribute)
        and n.value.func.attr == "state_dict"
        for t in n.targets
        if isinstance(t, ast.Name)
    )


def _iterated_dict(node: ast.For, dicts: frozenset[str]) -> str | None:
    """The state dict ``for key in sd`` (or ``sd.keys()``, or ``for key, value in sd.items()``) walks."""
    it, pair = node.iter, isinstance(node.target, ast.Tuple) and len(node.target.elts) == 2
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and not (it.args or it.keywords):
        if it.func.attr != ("items" if pair else "keys"):
            return None
        it = it.func.value
    elif pair:
        return None
    return it.id if isinstance(it, ast.Name) and it.id in dicts else None


def _chain(loop: _Loop, node: ast.expr) -> list[_Update] | None:
    """``x.m1_(...).m2_(...)`` on a loop tensor: its updates in order, or None when it is anything else."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _IN_PLACE):
        return None
    receiver = node.func.value
    before = [] if loop.is_ref(receiver) else _chain(loop, receiver)
    if before is None or not loop._arguments_fit(node):
        return None
    target = before[0].target if before else receiver
    keywords = tuple((k.arg, k.value) for k in node.keywords if k.arg is not None)
    return [*before, _Update(target, node.func.attr, tuple(node.args), keywords)]


def _statement(loop: _Loop, statement: ast.stmt) -> list[_Update] | None:
    if isinstance(statement, ast.Expr):
        return _chain(loop, statement.value)
    if isinstance(statement, ast.AugAssign) and type(statement.op) in _BINARY:
        target, value = statement.target, statement.value
        fits = loop.is_ref(target) and (loop.is_tensor(value) or loop.is_scalar(value))
        return [_Update(target, _BINARY[type(statement.op)] + "_", (value,))] if fits else None
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        # x.data = <value>: its values written over the tensor's; sd[key] = <value>: a state dict's entry, which
        # load_state_dict later copies into the tensor (copying it in place is the same)
        data = statement.targets[0]
        fits = (isinstance(data, ast.Attribute) and data.attr == "data") or isinstance(data, ast.Subscript)
        fits = fits and loop.is_ref(data)
        return [_Update(data, "copy_", (statement.value,))] if fits and loop.is_tensor(statement.value) else None
    return None


def read_loop(node: ast.For, state_dicts: frozenset[str] = frozenset()) -> _Loop | None:
    """The loop over parameters ``node`` is, when its body only updates the loop's tensors in place; or the loop
    over the keys of one of ``state_dicts`` whose body only sets keys of them to values made from theirs."""
    names = _names(node)
    if names is None or node.orelse:
        return None
    walked = _iterated_dict(node, state_dicts)
    if walked is not None:
        return _body(_Loop(node, names, (), dicts=tuple(sorted(state_dicts))))
    if _parameter_lists(node.iter) != len(names):
        return None
    return _body(_Loop(node, names, ()))


def _body(loop: _Loop) -> _Loop | None:
    """``loop`` with the updates its body makes, when that is all it does."""
    node = loop.node
    updates: list[_Update] = []
    for statement in node.body:
        found = _statement(loop, statement)
        if not found:
            return None
        updates += found
    return dataclasses.replace(loop, updates=tuple(updates))


# -- writing it as foreach calls -------------------------------------------------------------------------------------


def foreach_statements(loop: _Loop, each: Callable[[ast.expr], str], scalar: Callable[[ast.expr], str]) -> list[str]:
    """The loop as one ``torch._foreach_*`` call per op: ``each(ref)`` writes the list of a loop tensor's values,
    ``scalar(node)`` a value that does not depend on them (the user's code, or a stand-in when timing)."""

    def value(node: ast.expr) -> str:
        if loop.is_scalar(node):
            return scalar(node)
        if loop.is_ref(node):
            return each(node)
        if isinstance(node, ast.UnaryOp):
            return f"{_TORCH}._foreach_neg({value(node.operand)})"
        if isinstance(node, ast.BinOp):
            name, left, right = _BINARY[type(node.op)], node.left, node.right
            if loop.is_scalar(left) and name in ("add", "mul"):  # s + t is t + s, s * t is t * s, to the bit
                left, right = right, left
            if loop.is_scalar(left):  # s - t: -t + s, which rounds as s - t does
                return f"{_TORCH}._foreach_add({_TORCH}._foreach_neg({value(right)}), {value(left)})"
            return f"{_TORCH}._foreach_{name}({value(left)}, {value(right)})"
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)  # is_tensor said so
        return f"{_TORCH}._foreach_{node.func.attr}({call_arguments(node.func.value, node.args, node.keywords)})"

    def call_arguments(first: ast.expr, args: Any, keywords: Any) -> str:
        pairs = [(k.arg, k.value) if isinstance(k, ast.keyword) else k for k in keywords]
        return ", ".join([value(first), *(value(a) for a in args), *(f"{k}={scalar(v)}" for k, v in pairs)])

    return [f"{_TORCH}._foreach_{u.method}({call_arguments(u.target, u.args, u.keywords)})" for u in loop.updates]


def _list_name(index: SourceIndex, loop: _Loop) -> str:
    taken = {n.id for n in ast.walk(index.tree) if isinstance(n, ast.Name)}
    stem = ("items" if len(loop.names) > 1 else "keys") if loop.dicts else "pairs" if len(loop.names) > 1 else "params"
    for name in (stem, f"foreach_{stem}"):
        if name not in taken:
            return name
    raise ByHand("the names the foreach lists would take are in use in the file; write the foreach calls by hand")


# -- finding it ------------------------------------------------------------------------------------------------------


def _every_step(ctx: Context, index: SourceIndex, node: ast.For) -> bool | None:
    """True inside a loop that calls ``backward()``/``step()``; else whether its function was seen running."""
    parent = index.parents.get(node)
    while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(parent, (ast.For, ast.While)) and _steps(parent):
            return True
        parent = index.parents.get(parent)
    if parent is None:
        return None  # module level, outside any training loop
    return ctx.function_ran(index.site(node))


def _period_of(ctx: Context, index: SourceIndex, guard: ast.If) -> int | None:
    """Steps between the runs of ``guard``'s body: the product of the ``counter % N == 0`` (or ``not counter % N``)
    in its test, 1 without one (``!= 0`` runs most steps: 1 too); ``N`` a literal, a module-level constant or a
    period the run's watch read at that line. None where a period is unknown or the test is any other use of ``%``."""
    constants = {
        t.id: n.value.value
        for n in index.tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and type(n.value.value) is int
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    watched = ctx.recording.watched if ctx.recording is not None else None
    at_guard = (index.path, guard.lineno)
    recorded = [c.every for c in (watched.cadences if watched else ()) if (c.site.file, c.site.line) == at_guard]

    def every(mod: ast.BinOp) -> int | None:
        right = mod.right
        if isinstance(right, ast.Constant) and type(right.value) is int:
            return right.value if right.value >= 1 else None
        if isinstance(right, ast.Name) and right.id in constants:
            return constants[right.id] if constants[right.id] >= 1 else None
        return recorded[0] if recorded else None

    def is_mod(node: ast.AST) -> bool:
        return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod)

    period, read = 1, set()
    for node in ast.walk(guard.test):
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            mods = [m for m in (node.left, *node.comparators) if is_mod(m)]
            if mods and isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
                read.update(mods)
                n = every(cast(ast.BinOp, mods[0]))
                if n is None:
                    return None
                period *= n if isinstance(node.ops[0], ast.Eq) else 1
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and is_mod(node.operand):
            read.add(node.operand)
            n = every(cast(ast.BinOp, node.operand))
            if n is None:
                return None
            period *= n
    if any(is_mod(n) and n not in read for n in ast.walk(guard.test)):
        return None
    return period


def _guarded(ctx: Context, index: SourceIndex, node: ast.AST) -> int | None:
    """Steps between runs of ``node`` in its loop or function: the periods of the ``if`` tests around it (only
    where it sits in their body: an ``else`` runs the other steps)."""
    period: int | None = 1
    child, parent = node, index.parents.get(node)
    while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(parent, ast.If) and child in parent.body:
            every = _period_of(ctx, index, parent)
            period = None if every is None or period is None else period * every
        if isinstance(parent, (ast.For, ast.While)) and _steps(parent):
            break
        child, parent = parent, index.parents.get(parent)
    return period


def _steps(loop: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _STEP_CALLS
        for n in ast.walk(loop)
    )


def _every(ctx: Context, index: SourceIndex, node: ast.For) -> int | None:
    """Steps between the loop's runs: its own guards', times those around the calls of its function in the file's
    stepping loops (the least of them: a call that runs every step makes it run every step)."""
    own = _guarded(ctx, index, node)
    function = index.enclosing_function(node)
    name = getattr(function, "name", None)
    calls = [
        n
        for n in ast.walk(index.tree)
        if isinstance(n, ast.Call)
        and dotted_name(n.func).split(".")[-1] == name
        and index.enclosing_function(n) is not function
        and any(isinstance(a, (ast.For, ast.While)) and _steps(a) for a in _ancestors(index, n))
    ]
    if own is None or not calls:
        return own
    periods = [_guarded(ctx, index, call) for call in calls]
    known = [p for p in periods if p is not None]
    if 1 not in known and len(known) < len(periods):
        return None  # no call runs every step, and one's period is unknown
    return own * min(known)


def _ancestors(index: SourceIndex, node: ast.AST) -> Iterator[ast.AST]:
    parent = index.parents.get(node)
    while parent is not None:
        yield parent
        parent = index.parents.get(parent)


def _sampled(ctx: Context, index: SourceIndex, node: ast.For) -> bool:
    """Whether the gap sampler caught the loop running in the untimed time before a forward (after
    ``optimizer.step()``, which ends the step: that time is charged to data loading)."""
    lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
    return any(site.file == index.path and site.line in lines for site in ctx.gap_samples)


def _loops(ctx: Context) -> Iterator[tuple[SourceIndex, _Loop]]:
    for index in sources(ctx):
        state_dicts = _state_dicts(index)
        for node in ast.walk(index.tree):
            if isinstance(node, ast.For):
                loop = read_loop(node, state_dicts)
                if loop is not None:
                    yield index, loop


def _findings(ctx: Context, sampled: bool) -> Iterator[Finding]:
    for index, loop in _loops(ctx):
        if _sampled(ctx, index, loop.node) != sampled or not (sampled or _every_step(ctx, index, loop.node)):
            continue
        iterable = ast.unparse(loop.node.iter)
        methods = tuple(u.method for u in loop.updates)
        every = _every(ctx, index, loop.node)
        how = (
            "makes each state-dict tensor anew, one key at a time (load_state_dict then copies them in)"
            if loop.dicts
            else f"updates the tensors one at a time ({', '.join(sorted(set(methods)))})"
        )
        cadence = (
            " It runs under an `if` whose period the run did not show: it is named, not timed."
            if every is None
            else f" It runs every {every} steps."
            if every > 1
            else ""
        )
        f = Finding(
            "non-foreach-update",
            site=index.site(loop.node),
            # Run between optimizer.step() and the next forward, its time is the data-loading phase's.
            category="data_loading" if sampled else None,
            message=(
                f"This loop over {iterable} {how}: one small kernel, and its Python and dispatch cost, per tensor "
                "and op, each time it runs."
                + cadence
                + (" It runs before the next forward, so its time shows as data loading." if sampled else "")
            ),
            fix=Fix(
                "one torch._foreach_* call per op over lists of the tensors (torch._foreach_mul_, "
                "torch._foreach_add_, torch._foreach_lerp_, ...); for an EMA of the weights, "
                "torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))",
                lightning="the same foreach calls in the hook that runs the loop (on_train_batch_end)",
            ),
            evidence=UpdateEvidence(iterable=iterable, methods=methods, every=every),
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


def _loop_at(ctx: Context, site: Site | None) -> tuple[SourceIndex, _Loop] | None:
    """The loop a finding names, read again from the source the run read."""
    return next(
        ((i, loop) for i, loop in _loops(ctx) if site and i.path == site.file and loop.node.lineno == site.line), None
    )


# -- timing ----------------------------------------------------------------------------------------------------------


class _StandIns(ast.NodeTransformer):
    """The loop as the timing runs it: over ``_l0, _l1, ...`` (copies of the model's parameters, which have no
    ``.grad``: a gradient is timed as a tensor of the same shape) or state dicts ``_d0, _d1, ...`` (copies of the
    model's), each value that does not depend on the loop's tensors ``_s``."""

    def __init__(self, loop: _Loop) -> None:
        self.loop = loop

    def visit(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Name) and node.id in self.loop.dicts:
            return ast.Name(f"_d{self.loop.dicts.index(node.id)}", ast.Load())
        if isinstance(node, ast.expr) and self.loop.is_scalar(node):
            return ast.Name("_s", ast.Load())
        if isinstance(node, ast.Attribute) and node.attr == "grad":
            return self.visit(node.value)
        return super().visit(node)


def _timed_code(loop: _Loop) -> tuple[str, str]:
    """(the loop, its foreach calls) over the stand-ins, as code to run."""
    lists = ", ".join(f"_l{i}" for i in range(len(loop.names)))
    iterable = f"zip({lists})" if len(loop.names) > 1 else "_l0"
    if loop.dicts:  # the state dict's own keys (or items), as the loop walks them
        walked = ast.parse(ast.unparse(loop.node.iter), mode="eval").body
        for name in ast.walk(walked):
            if isinstance(name, ast.Name) and name.id in loop.dicts:
                name.id = f"_d{loop.dicts.index(name.id)}"
        iterable = ast.unparse(walked)
    target = ", ".join(loop.names)
    body = "\n".join(
        f"    {ast.unparse(_StandIns(loop).visit(ast.parse(ast.unparse(s)).body[0]))}" for s in loop.node.body
    )
    per_tensor = f"for {target} in {iterable}:\n{body}"

    def each(node: ast.expr) -> str:
        return f"[{ast.unparse(_StandIns(loop).visit(node))} for {target} in {iterable}]"

    foreach = "\n".join(foreach_statements(loop, each, lambda node: "_s")).replace(_TORCH, "torch")
    return per_tensor, foreach


def measure(ctx: Context, finding: Finding, budget: TimeLeft) -> Measured | None:
    """The loop over copies of the model's parameter tensors against its foreach calls, ``ROUNDS`` interleaved
    rounds of the fastest of ``REPEATS`` calls each."""
    model = ctx.capture.module if ctx.capture is not None else None
    params = list(model.parameters()) if model is not None else []
    found = _loop_at(ctx, finding.site)
    if model is None or not params or found is None or not budget.allows(1.0):
        return None
    loop, every = found[1], cast(UpdateEvidence, finding.evidence).every
    if every is None:
        return None  # how often it runs is unknown: a gain per step would be a guess
    per_tensor, foreach = (compile(code, "<non-foreach-update>", "exec") for code in _timed_code(loop))
    with torch.no_grad():
        scope: dict[str, Any] = {"torch": torch, "_s": 1.0}  # 1.0 keeps the values' magnitudes (no denormals)
        if loop.dicts:
            state = model.state_dict()
            scope.update({f"_d{i}": {k: v.clone() for k, v in state.items()} for i in range(len(loop.dicts))})
            tensors, what = len(state), "state-dict tensors"
        else:
            scope.update({f"_l{i}": [p.detach().clone() for p in params] for i in range(len(loop.names))})
            tensors, what = len(params), "parameter tensors"
        exec(per_tensor, scope)  # noqa: S102 - the user's loop, its values replaced by stand-ins, on copies
        exec(foreach, scope)  # noqa: S102 - the foreach calls the edit would write, on the same copies

        def run(code: Any) -> Callable[[], None]:
            return lambda: exec(code, scope)  # noqa: S102 - the loop or its foreach calls, as above

        pairs = [fastest_pair(run(per_tensor), run(foreach), ctx.on_gpu, REPEATS) for _ in range(ROUNDS)]
    ratios = tuple(round(loop_s / fast, 3) for loop_s, fast in pairs if fast > 0)
    loop_s, foreach_s = min(p[0] for p in pairs), min(p[1] for p in pairs)
    return Measured(
        what_if=ForeachResult(
            tensors=tensors, rounds=ratios, loop_ms=round(loop_s * 1e3, 4), foreach_ms=round(foreach_s * 1e3, 4)
        ),
        verdict=judge(ratios, noise_floor=ctx.noise_floor),
        applies_to=min(1.0, loop_s / every / ctx.step_s) if ctx.step_s > 0 else 0.0,
        note=(
            f"Timed on your model's {tensors} {what}: {ms(loop_s)} one tensor at a time, "
            f"{ms(foreach_s)} foreach" + (f", once every {every} steps." if every > 1 else ".")
        ),
    )


# -- the edit --------------------------------------------------------------------------------------------------------


def edit(ctx: Context, f: Finding) -> EditSpec:
    found = _loop_at(ctx, f.site)
    if found is None:
        raise ByHand(f"no loop over parameters at {ctx.where(f.site)} (the line changed since the run?)")
    index, loop = found
    listed = _list_name(index, loop)
    target = ", ".join(loop.names)  # ast.unparse would write a tuple target in parentheses
    iterable = ast.unparse(loop.node.iter)
    statements = [f"{listed} = list({iterable})"]
    statements += foreach_statements(loop, lambda ref: f"[{ast.unparse(ref)} for {target} in {listed}]", ast.unparse)
    label = f"the loop over {iterable} as {len(loop.updates)} foreach call(s)"
    return EditSpec("rule", label, params={"statements": statements, "iterable": iterable}, numerics=EXACT)


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
