"""`batch-size-not-multiple-of-8`: the batch size.

Reads: model.
Applies to: a GPU; not a whole graph fed as one batch (its rows are the graph's nodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...findings import Evidence, Finding, Fix, speedup_for_rule
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class BatchSizeEvidence(Evidence):
    batch_size: int


def batch_size_not_multiple_of_8(ctx: Context) -> Iterator[Finding]:
    loader = ctx.main_loader
    # The loader says what a batch is; the model's input only guesses at its dimension (sequences, images).
    batch = (loader.settings.get("batch_size") if loader else None) or ctx.facts.batch_size
    if not batch or batch < 8 or batch % 8 == 0:
        return
    if not loader and ctx.facts.whole_graph:
        return  # the rows are a graph's nodes: its size is the data's, not a setting
    site = ctx.main_loader.site if ctx.main_loader else (ctx.capture.site if ctx.capture else None)
    f = Finding(
        "batch-size-not-multiple-of-8",
        site=site,
        category="compute",
        speedup=speedup_for_rule("batch-size-not-multiple-of-8"),
        message=f"The batch size is {batch}, not a multiple of 8: the batch is a matrix dimension of every layer.",
        fix=Fix(
            f"batch_size={batch // 8 * 8 or 8} or {(batch // 8 + 1) * 8}", plan={"batch_size": (batch // 8 + 1) * 8}
        ),
        evidence=BatchSizeEvidence(batch_size=batch),
    )
    f.provisional("medium" if ctx.on_gpu and ctx.breakdown.bottleneck == "compute" and ctx.facts.autocast else "low")
    yield f.on_cpu(ctx, " with tensor cores")


RULE = register(Rule("batch-size-not-multiple-of-8", detect=(Detect("live", batch_size_not_multiple_of_8),)))
