"""`syncbn-with-compile`: SyncBatchNorm in a compiled model.

Reads: model, source.
Applies to: a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from torch import nn

from ...findings import Finding, Fix, speedup_for_rule
from ..common import sources, static_finding
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


def syncbn_with_compile(ctx: Context) -> Iterator[Finding]:
    model = ctx.model
    if model is None or not any(isinstance(m, nn.SyncBatchNorm) for m in model.modules()):
        return
    if not (ctx.facts.compiled or ctx.seen("compile")):
        return
    f = Finding(
        "syncbn-with-compile",
        site=ctx.module_site(model),
        category="compute",
        speedup=speedup_for_rule("syncbn-with-compile"),
        message="The compiled model contains SyncBatchNorm: every SyncBatchNorm is a cross-process collective that "
        "breaks the compiled graph, giving back much of what compile buys.",
        fix=Fix(
            "use plain BatchNorm with compile (or keep SyncBatchNorm and drop compile)",
            plan={"sync_batchnorm": False},
            lightning="Trainer(sync_batchnorm=False) with a compiled model",
        ),
    )
    f.provisional("medium")
    yield f.on_cpu(ctx)


def syncbn_static(ctx: Context) -> Iterator[Finding]:
    for index in sources(ctx):
        syncbn = list(index.calls("convert_sync_batchnorm", "SyncBatchNorm"))
        compiled = list(index.calls("torch.compile"))
        if syncbn and compiled:
            yield static_finding(
                "syncbn-with-compile",
                index,
                compiled[0][0],
                "The script both converts to SyncBatchNorm and compiles: each SyncBatchNorm breaks the compiled graph.",
                Fix("drop one of the two"),
                speedup=speedup_for_rule("syncbn-with-compile"),
            ).on_cpu(ctx)


RULE = register(
    Rule(
        "syncbn-with-compile",
        detect=(
            Detect("live", syncbn_with_compile),
            Detect("static", syncbn_static),
        ),
    )
)
