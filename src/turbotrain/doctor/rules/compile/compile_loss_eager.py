"""`compile-loss-eager`: a loss of `torch.nn.functional`'s (an nn loss module's too) called on a compiled graph's
output outside the graph (Inductor or another AOT backend; `backend="eager"` has no graph to fuse it into), at the
loss's line, with the eager ops between: the model compiled as the script compiles it with the loss eager after it,
against the model and the loss compiled as one, timed on the captured batch and the script's own target, fresh
compiles of both, their first-call seconds and the step.

Reads: live objects + model.
Edit: the loss's call (`F.cross_entropy(compiled(x), y)`) moved into a function compiled with the keywords of the
`torch.compile(...)` call that compiled the model (the script's one, or of several the one assigned to the name the
loss's line calls), defined before the top-level statement that holds the call and called in its place: the model's
last ops and the loss in one graph (torch.compile inlines the compiled model it is given); it changes kernels, so
the losses are held to the numerics guard. By hand where the call passes `*args`, holds a lambda, the line calls an nn
loss module (`self.criterion(logits, y)`), or the file does not `import torch`.

torch.compile of the model alone leaves the loss to eager PyTorch: its forward and backward run op by op, and
Inductor cannot fuse it with the model's last ops (the head's matmul with cross-entropy's log-softmax). Timed on the
captured batch and the script's own target: the model compiled as the script compiles it with the loss eager after
it, against one compile of the model and the loss together; fresh compiles of both, interleaved. Compile time is
said, never counted as a per-step gain.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import torch

from ...analysis.source import dotted_name
from ...edits import PRECISION, ByHand, EditSpec
from ...findings import Evidence, Finding, Fix
from ...requests import OwnTrial
from ..rule import Detect, Measured, Rule, TimeLeft, register
from ._common import (
    PairTiming,
    Variant,
    compile_calls,
    compile_seconds,
    compiled_like,
    compiled_model,
    eager_copy,
    measured_pair,
    one_compile_call,
    pair_text,
    recompiled,
)

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...sites import Site
    from ...record.loss_capture import EagerLoss


class ModelAndLoss(torch.nn.Module):
    """The model's forward then the script's loss on its output (viewed as the script viewed it) and target."""

    def __init__(self, model: torch.nn.Module, loss: EagerLoss) -> None:
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = self.model(*args, **kwargs)
        if not isinstance(out, torch.Tensor):
            raise TypeError("the compiled model returns no single tensor: the loss's input cannot be rebuilt")
        return self.loss.call(out.reshape(self.loss.input_shape), *self.loss.rest, **self.loss.kwargs)


def _replayable(ctx: Context, loss: EagerLoss, model: torch.nn.Module) -> bool:
    """The loss's input is the compiled model's output reshaped (its elements, in order), on the captured batch."""
    assert ctx.capture is not None  # compiled_model found the captured model
    original = model._orig_mod
    assert isinstance(original, torch.nn.Module)  # compiled_model checked it
    with torch.no_grad():
        out = original(*ctx.capture.args, **ctx.capture.kwargs)
    return isinstance(out, torch.Tensor) and out.numel() == torch.Size(loss.input_shape).numel()


@dataclass(frozen=True)
class EagerLossEvidence(Evidence):
    loss: str  # its name in torch.nn.functional: "cross_entropy"
    between: tuple[str, ...]  # the autograd nodes between the compiled graph and the loss's input
    input_shape: tuple[int, ...]


def _loss_as_written(ctx: Context, site: Site | None, function: str) -> tuple[str, bool]:
    """The loss's call as the script writes it at ``site`` (``self.criterion(logits, y)`` for an nn loss module), and
    whether that is a call of the function itself (``F.cross_entropy(...)``), which the edit can move."""
    index = ctx.sources.get(site.file) if site is not None else None
    if index is None or site is None:
        return f"F.{function}", True
    calls = sorted(
        (n for n in ast.walk(index.tree) if isinstance(n, ast.Call) and n.lineno == site.line),
        key=lambda n: n.col_offset,
    )
    if any(dotted_name(c.func).split(".")[-1] == function for c in calls) or not calls:
        return f"F.{function}", True
    return f"`{ast.unparse(calls[0])}` (F.{function})", False


def loss_outside(ctx: Context) -> Iterator[Finding]:
    loss, model = ctx.eager_loss, compiled_model(ctx)
    if loss is None or model is None or ctx.capture is None:
        return
    ops = ", ".join(loss.between[:3]) + (", ..." if len(loss.between) > 3 else "")
    via = f" (after {len(loss.between)} eager op(s) on it: {ops})" if loss.between else ""
    call = f"F.{loss.function}"
    written, _ = _loss_as_written(ctx, loss.site, loss.function)
    f = Finding(
        "compile-loss-eager",
        site=loss.site,
        category="compute",
        message=(
            f"The loss, {written}, runs outside the compiled graph on the compiled model's output{via}: its forward "
            "and backward run op by op, and torch.compile cannot fuse it with the model's last ops."
        ),
        fix=Fix(
            f"Compile the model and the loss as one: a module (or function) whose forward returns {call}(model(x), "
            "y), compiled in place of the model alone, e.g. `loss_fn = torch.compile(lambda x, y: "
            f"{call}(model(x), y))`",
            lightning="Compute the loss inside a compiled module: compile the LightningModule's training_step's "
            "model and loss together (a module whose forward returns the loss), not the model alone",
            hf_trainer="torch_compile=True compiles the model only: return the loss from the model's forward (pass "
            "labels) so that it is compiled with it",
        ),
        evidence=EagerLossEvidence(loss=loss.function, between=loss.between, input_shape=loss.input_shape),
        request=OwnTrial(),
    )
    f.provisional("low")
    f.note = "Unmeasured: the what-ifs compile the model with the loss and time both ways."
    yield f


def measure(ctx: Context, f: Finding, budget: TimeLeft) -> Measured | None:
    """The script's compiled model with its loss after it, eager, against the model and the loss compiled as one."""
    model, loss = compiled_model(ctx), ctx.eager_loss
    if model is None or loss is None or not _replayable(ctx, loss, model):
        return None  # the loss's input is not the model's output reshaped: nothing to rebuild it from
    first, again = compile_seconds(ctx)
    apart = Variant(f"the model compiled, F.{loss.function} eager", ModelAndLoss(recompiled(model), loss))
    together = Variant(
        f"the model and F.{loss.function} compiled as one", compiled_like(model, ModelAndLoss(eager_copy(model), loss))
    )

    def say(timing: PairTiming, _steps_differ: bool) -> str:
        return pair_text(timing, "with the loss eager", "with the loss compiled in", "compile the loss with the model")

    return measured_pair(ctx, budget, apart, together, say, first, first + again)


def _model_compile(ctx: Context, f: Finding) -> ast.Call:
    """The ``torch.compile(...)`` call that compiled the model the loss is computed on: the script's one, or of
    several the one assigned to the name the loss's call calls (``compiled = torch.compile(model, ...)`` for
    ``F.cross_entropy(compiled(x), y)``)."""
    fix = f"the loss compiled with the model ({f.fix.pytorch})"
    calls = compile_calls(ctx)
    if len(calls) <= 1 or f.site is None or f.site.file not in ctx.sources:
        return one_compile_call(ctx, fix, "the model")[1]
    index = ctx.sources[f.site.file]
    # The calls on the loss's line whose first argument calls a plain name: the compiled model's.
    models = {
        node.args[0].func.id
        for node in ast.walk(index.tree)
        if isinstance(node, ast.Call)
        and node.lineno == f.site.line
        and node.args
        and isinstance(node.args[0], ast.Call)
        and isinstance(node.args[0].func, ast.Name)
    }
    assigned = [
        call
        for index, call in calls
        if isinstance(assign := index.parents.get(call), ast.Assign)
        and any(isinstance(t, ast.Name) and t.id in models for t in assign.targets)
    ]
    if len(assigned) != 1:
        return one_compile_call(ctx, fix, "the model")[1]  # says where the calls are
    return assigned[0]


def edit(ctx: Context, f: Finding) -> EditSpec:
    """The loss's call moved into a function compiled as the script compiles its model (the keywords of its one
    ``torch.compile`` call, as written), called in its place: the model and the loss as one graph. Other kernels: the
    loss is held to the numerics guard, not bitwise."""
    loss = f.evidence_as(EagerLossEvidence).loss
    written, direct = _loss_as_written(ctx, f.site, loss)
    if not direct:
        # An nn loss module (`self.criterion`) or a function of the script's: no F.<loss> call on the line to move.
        raise ByHand(f"the loss is called as {written}, not as F.{loss}(...) on this line; {f.fix.pytorch}")
    keywords = ", ".join(ast.unparse(k) for k in _model_compile(ctx, f).keywords)
    label = f"F.{loss} compiled with the model as one function ({keywords or 'torch.compile defaults'})"
    return EditSpec("compile_loss", label, {"loss": loss, "compile": keywords}, numerics=PRECISION)


RULE = register(Rule("compile-loss-eager", detect=(Detect("live", loss_outside),), measure=measure, edit=edit))
