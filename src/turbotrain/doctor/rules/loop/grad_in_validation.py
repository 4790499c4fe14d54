"""`grad-in-validation`: eval-mode forwards with autograd on and no backward.

Reads: run, source.
Edit: `with torch.inference_mode():` around the validation code that ran with autograd on (the outermost statement
around the forward, inside its function, that does no training).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...analysis.source import SourceIndex, dotted_name
from ...edits import EditSpec
from ...findings import Evidence, Finding, Fix
from ...requests import EvalGradRequest
from ..common import sources, static_finding
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class EvalGradEvidence(Evidence):
    forwards: int  # eval-mode forwards with autograd on, in the whole run
    ms_total: float
    share_of_run: float


def grad_in_validation(ctx: Context) -> Iterator[Finding]:
    for _kind, site, tally in ctx.seen("eval_grad_forward"):
        count, seconds, _ = tally.total(ctx.measured_steps)
        all_count, all_seconds, _ = tally.total(tally.by_step.keys())
        total_s = sum(s.duration for s in ctx.step_records) or 1.0
        share = seconds / (ctx.step_s * max(1, len(ctx.measured_steps))) if count else all_seconds / total_s
        f = Finding(
            "grad-in-validation",
            site=site,
            category="outside_step",
            message=(
                f"The model runs in eval mode with autograd on here ({all_count} forward(s), none followed by "
                f"a backward): every activation is kept for a backward that never comes "
                f"({share:.0%} of run time)."
            ),
            fix=Fix(
                "Wrap validation/inference in `with torch.inference_mode():` (or torch.no_grad())",
                lightning="automatic: validation_step already runs under inference_mode",
                accelerate="`with torch.no_grad():` around the evaluation loop",
                hf_trainer="automatic: Trainer.evaluate() runs under torch.no_grad()",
            ),
            evidence=EvalGradEvidence(forwards=all_count, ms_total=round(all_seconds * 1e3, 2), share_of_run=share),
            request=EvalGradRequest(share),
        )
        f.provisional("low")  # what autograd costs here is measured by the what-if
        yield f


def _grad_disabled(index: SourceIndex, node: ast.AST) -> bool:
    """Inside `with torch.no_grad()/inference_mode()` or a function decorated with them."""
    parent = index.parents.get(node)
    while parent is not None:
        if isinstance(parent, (ast.With, ast.AsyncWith)):
            if any(
                dotted_name(
                    item.context_expr.func if isinstance(item.context_expr, ast.Call) else item.context_expr
                ).endswith(("no_grad", "inference_mode"))
                for item in parent.items
            ):
                return True
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and _turns_grad_off(parent.decorator_list):
            return True
        parent = index.parents.get(parent)
    return False


def _turns_grad_off(decorators: list[ast.expr]) -> bool:
    return any(
        dotted_name(d.func if isinstance(d, ast.Call) else d).endswith(("no_grad", "inference_mode"))
        for d in decorators
    )


def _decorator_named(index: SourceIndex, func: ast.AST | None) -> str | None:
    """The decorator ``func`` is the wrapper of (``eval_decorator`` for its ``inner``), or None: a function
    defined inside another that returns it, followed up through decorator factories."""
    name = None
    while isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        outer = index.enclosing_function(func)
        if not isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef)) or not any(
            isinstance(node, ast.Return) and isinstance(node.value, ast.Name) and node.value.id == func.name
            for node in outer.body
        ):
            break
        name, func = outer.name, outer
    return name


def _decorated_with(ctx: Context, decorator: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions of the script's files decorated with ``decorator`` (``@decorator``, ``@mod.decorator``)."""
    found = []
    for index in sources(ctx):
        for node in ast.walk(index.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                dotted_name(d.func if isinstance(d, ast.Call) else d).split(".")[-1] == decorator
                for d in node.decorator_list
            ):
                found.append(node)
    return found


def _called_without_grad(ctx: Context, index: SourceIndex, call: ast.Call) -> bool:
    """How the code that ran called this ``.eval()``: a wrapper (a decorator's ``inner``) whose every use is stacked
    under ``@torch.no_grad()``, or a function that ran while the run's eval-mode forwards all ran without autograd."""
    decorator = _decorator_named(index, index.enclosing_function(call))
    if decorator is not None:
        uses = _decorated_with(ctx, decorator)
        if uses and all(_turns_grad_off(use.decorator_list) for use in uses):
            return True
    return bool(ctx.function_ran(index.site(call)) and ctx.seen("eval_forward") and not ctx.seen("eval_grad_forward"))


_MODE_AND_PLACE = ("eval", "train", "to", "cpu", "cuda", "requires_grad_", "zero_grad")


def _evaluates_after(scope: ast.AST, call: ast.Call) -> bool:
    """Whether ``scope`` uses the module switched to eval mode after ``call`` for anything but setting its mode or
    place: calls it (``model(x)``, ``model.generate(...)``) or hands it to a call (``evaluate(model, loader)``). A
    function that only switches the mode and returns the module (nanochat's ``build_model``: ``if phase == "eval":
    model.eval() else: model.train()``) evaluates nothing there."""
    assert isinstance(call.func, ast.Attribute)  # the caller checked
    module = ast.unparse(call.func.value)
    for node in ast.walk(scope):
        if not isinstance(node, ast.Call) or (node.lineno, node.col_offset) <= (call.lineno, call.col_offset):
            continue
        func = node.func
        if ast.unparse(func) == module:
            return True
        if isinstance(func, ast.Attribute) and ast.unparse(func.value) == module and func.attr not in _MODE_AND_PLACE:
            return True
        if any(ast.unparse(a) == module for a in [*node.args, *(k.value for k in node.keywords)]):
            return True
    return False


def grad_in_validation_static(ctx: Context) -> Iterator[Finding]:
    for index in sources(ctx):
        for call, name in index.calls("eval"):
            if not isinstance(call.func, ast.Attribute) or call.args or _grad_disabled(index, call):
                continue
            func = index.enclosing_function(call)
            scope = func if func is not None else index.tree
            text = ast.unparse(scope)
            if "no_grad" in text or "inference_mode" in text or _called_without_grad(ctx, index, call):
                continue
            if not _evaluates_after(scope, call):
                continue
            yield static_finding(
                "grad-in-validation",
                index,
                call,
                f"{name}() switches to evaluation, but nothing here turns autograd off: the forward "
                "passes that follow keep activations for a backward that never comes.",
                Fix("`with torch.inference_mode():` around the evaluation"),
            )


def edit(ctx: Context, f: Finding) -> EditSpec:
    return EditSpec("inference_mode", "with torch.inference_mode(): around the validation")


RULE = register(
    Rule(
        "grad-in-validation",
        detect=(
            Detect("runtime", grad_in_validation),
            Detect("static", grad_in_validation_static),
        ),
        edit=edit,
    )
)
