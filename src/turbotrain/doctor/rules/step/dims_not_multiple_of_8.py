"""`dims-not-multiple-of-8`: a large Linear/Embedding/Conv dimension not a multiple of 8 (e.g. vocab 50257).

Reads: model.
Applies to: a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, cast

from torch import nn

from ...findings import Evidence, Finding, Fix
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


_SHAPED = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True)
class DimsEvidence(Evidence):
    module: str
    dims: tuple[int, int]  # its in and out features (an embedding's count and width)


def _dims(module: nn.Module) -> tuple[int, int]:
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if isinstance(module, nn.Embedding):
        return module.num_embeddings, module.embedding_dim
    conv = cast("nn.Conv1d | nn.Conv2d | nn.Conv3d", module)  # the rest of _SHAPED
    return conv.in_channels, conv.out_channels


def dims_not_multiple_of_8(ctx: Context) -> Iterator[Finding]:
    model = ctx.model
    if model is None:
        return
    total = sum(p.numel() for p in model.parameters()) or 1
    reported = 0
    for name, module in model.named_modules():
        if not isinstance(module, _SHAPED) or reported >= 3:
            continue
        dims = _dims(module)
        odd = [d for d in dims if d >= 64 and d % 8]
        weight = module.weight.numel() if getattr(module, "weight", None) is not None else 0
        if not odd or weight / total < 0.05:
            continue
        padded = [-(-d // 64) * 64 for d in odd]
        f = Finding(
            "dims-not-multiple-of-8",
            site=ctx.module_site(module),
            category="compute",
            message=(
                f"{name or type(module).__name__} ({type(module).__name__}{dims}) has "
                f"{', '.join(map(str, odd))} as a matrix dimension, not a multiple of 8: tensor cores then "
                f"fall back to slower kernels ({weight / total:.0%} of the model's weights)."
            ),
            fix=Fix(
                f"pad it to {', '.join(map(str, padded))} (a multiple of 64), e.g. a vocabulary padded with "
                "unused tokens"
            ),
            evidence=DimsEvidence(module=name, dims=dims),
        )
        f.provisional("medium" if ctx.on_gpu and (ctx.facts.autocast or ctx.hw.tf32) else "low")
        reported += 1
        yield f.on_cpu(ctx, " with tensor cores")


RULE = register(Rule("dims-not-multiple-of-8", detect=(Detect("live", dims_not_multiple_of_8),)))
