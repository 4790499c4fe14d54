"""`manual-attention`: matmul-softmax-matmul attention that ran in the step (timed).

Reads: source + run.
Edit: `F.scaled_dot_product_attention(q, k, v, ...)` for `softmax(q @ k.transpose(-2, -1) * scale) @ v`: the scale
kept, a `triu(1)` mask (or a causal buffer's top-left corner, nanoGPT's `self.bias[:, :, :T, :T] == 0`) as
`is_causal=True`, another boolean mask as `attn_mask=~mask`, dropout on the weights as
`dropout_p` (a module's while it is training).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from torch import nn

from ...analysis.source import dotted_name
from ...edits import PRECISION, RESAMPLED, EditSpec
from ...findings import Evidence, Finding, Fix
from ...requests import AttentionRequest
from ..common import ran_per_step, sources
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class AttentionEvidence(Evidence):
    function: str  # the function that computes it
    per_step: float  # its softmax's calls per measured step
    dropout: bool = False  # dropout applied to the weights (the softmax's output)


def _has_transposed_matmul(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.MatMult):
            text = ast.unparse(sub)
        elif isinstance(sub, ast.Call) and dotted_name(sub.func).split(".")[-1] in ("matmul", "bmm", "einsum"):
            text = ast.unparse(sub)
        else:
            continue
        if any(t in text for t in (".transpose(", ".mT", ".T", ".permute(", "->")):
            return True
    return False


def manual_attention(ctx: Context) -> Iterator[Finding]:
    for index in sources(ctx):
        classes = [c for c in ast.walk(index.tree) if isinstance(c, ast.ClassDef)]
        for func in ast.walk(index.tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = ast.Module(body=func.body, type_ignores=[])
            names = {dotted_name(c.func).split(".")[-1] for c in ast.walk(body) if isinstance(c, ast.Call)}
            if "softmax" not in names or not _has_transposed_matmul(body):
                continue
            softmax = next(
                c for c in ast.walk(body) if isinstance(c, ast.Call) and dotted_name(c.func).split(".")[-1] == "softmax"
            )
            site = index.site(softmax)
            per_step = ran_per_step(ctx, "softmax", site)
            fused = _fused_branch(func)
            if "scaled_dot_product_attention" in names and (fused is None or not per_step):
                continue  # the function's own fused call may be what runs: only its softmax seen running says not
            lines = (func.lineno, func.end_lineno or func.lineno)
            source = ast.unparse(func)
            owner = next((c for c in classes if func in c.body), None)
            causal = any(word in source for word in ("triu", "tril", "causal")) or any(
                re.search(rf"\bself\.{name}\b", source) for name in _triangular_buffers(owner)
            )
            f = Finding(
                "manual-attention",
                site=site,
                category="compute",
                message=(
                    f"{func.name}() computes attention by hand (matmul, softmax, matmul): the full score "
                    "matrix is written to memory and read back, and no fused flash/memory-efficient kernel "
                    "can run."
                    + (f" It runs {per_step:g}x per step." if per_step else "")
                    + (_branch_said(fused) if fused is not None else "")
                ),
                fix=Fix(
                    "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=..., is_causal=...)"
                    + (
                        f", or take the script's own branch that calls it (make `{fused.condition}` {fused.wanted})"
                        if fused is not None
                        else ""
                    )
                ),
                evidence=AttentionEvidence(func.name, per_step, _drops_weights(func, softmax)),
                request=AttentionRequest(index.path, lines, site, per_step, bool(causal)),
            )
            f.provisional("medium" if per_step else "low")
            if not per_step:
                f.note = "Not seen running during the measured steps."
            yield f


@dataclass(frozen=True)
class FusedBranch:
    """The function's own ``scaled_dot_product_attention`` call, in one branch of an ``if``: the condition's text
    and what it must be for that branch to run."""

    line: int
    condition: str
    wanted: str  # "true" or "false"


def _fused_branch(func: ast.FunctionDef | ast.AsyncFunctionDef) -> FusedBranch | None:
    """Where ``func`` calls scaled_dot_product_attention inside an ``if`` (llm.c's ``if FLASH:``, off by default);
    None where it calls none, or calls it outside any ``if``."""
    for node in ast.walk(func):
        if not isinstance(node, ast.If):
            continue
        for branch, wanted in ((node.body, "true"), (node.orelse, "false")):
            for call in (c for statement in branch for c in ast.walk(statement) if isinstance(c, ast.Call)):
                if dotted_name(call.func).split(".")[-1] == "scaled_dot_product_attention":
                    return FusedBranch(call.lineno, ast.unparse(node.test), wanted)
    return None


def _branch_said(fused: FusedBranch) -> str:
    return (
        f" The function's own scaled_dot_product_attention (line {fused.line}) runs only where `{fused.condition}` "
        f"is {fused.wanted}; this run took the hand-written branch."
    )


def _triangular_buffers(owner: ast.ClassDef | None) -> set[str]:
    """Buffers the class makes of ``tril``/``triu`` (nanoGPT's ``register_buffer("bias", torch.tril(...))``): a
    forward of it that reads one masks its scores causally."""
    if owner is None:
        return set()
    return {
        call.args[0].value
        for call in ast.walk(owner)
        if isinstance(call, ast.Call)
        and dotted_name(call.func).endswith("register_buffer")
        and len(call.args) >= 2
        and isinstance(call.args[0], ast.Constant)
        and isinstance(call.args[0].value, str)
        and any(w in ast.unparse(call.args[1]) for w in ("tril", "triu"))
    }


def _drops_weights(func: ast.AST, softmax: ast.Call) -> bool:
    """Whether ``func`` applies dropout to the attention weights: to the softmax call, or to a name it was assigned."""
    weights = {
        t.id
        for node in ast.walk(func)
        if isinstance(node, ast.Assign) and node.value is softmax
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    return any(
        isinstance(call, ast.Call)
        and "dropout" in dotted_name(call.func).split(".")[-1].lower()
        and bool(call.args)
        and (call.args[0] is softmax or (isinstance(call.args[0], ast.Name) and call.args[0].id in weights))
        for call in ast.walk(func)
    )


def edit(ctx: Context, f: Finding) -> EditSpec:
    assert f.site is not None  # fixes.choose plans only findings with a site
    evidence = f.evidence_as(AttentionEvidence)
    line = f.request.softmax.line if isinstance(f.request, AttentionRequest) else f.site.line
    # SDPA draws its own dropout masks: the patched losses differ by dropout's noise, not by precision.
    numerics = RESAMPLED if evidence.dropout else PRECISION
    label = f"scaled_dot_product_attention for the attention in {evidence.function}()"
    params = {**_dropout_modules(ctx), **_operand_dims(ctx, f.request)}
    return EditSpec("sdpa", label, params, numerics=numerics, line=line)


def _operand_dims(ctx: Context, request: object) -> dict[str, int]:
    """``{"ndim": n}`` where every matmul the run saw in the attention's function had n-d operands (the edit then
    reads ``transpose(n - 2, n - 1)`` as the last two dimensions); nothing where it saw none or several."""
    if not isinstance(request, AttentionRequest):
        return {}
    first, last = request.lines
    dims = {
        len(shape)
        for site, shapes in ctx.matmul_shapes.items()
        if site.file == request.file and first <= site.line <= last
        for shape in shapes
    }
    return {"ndim": dims.pop()} if len(dims) == 1 else {}


def _dropout_modules(ctx: Context) -> dict[str, list[str]]:
    """The attribute names of the captured model's dropout modules (``attn_dropout``), so that the edit takes a
    module call for dropout by what it is, not by its name; none where no model was captured."""
    capture = ctx.capture
    if capture is None:
        return {}
    kinds = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
    names = {name.rpartition(".")[2] for name, m in capture.module.named_modules() if isinstance(m, kinds)}
    return {"dropout_modules": sorted(names)}


RULE = register(Rule("manual-attention", detect=(Detect("static", manual_attention),), edit=edit))
