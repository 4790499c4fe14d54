"""`cudnn-benchmark-off`: a conv net without `cudnn.benchmark`.

Reads: model, source.
Applies to: a GPU.
Edit: `torch.backends.cudnn.benchmark = True` after the imports (or the script's own `= False` flipped).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Iterator

from ...analysis.source import dotted_name, is_const
from ...edits import EditSpec
from ...findings import Finding, Fix, lightning_call, speedup_for_rule
from ..common import for_this_model, sources, static_finding, switch_finding
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


def cudnn_benchmark_off(ctx: Context) -> Iterator[Finding]:
    if not for_this_model(ctx, "cudnn_benchmark") or ctx.facts.cudnn_benchmark:
        return
    if not ctx.on_gpu and not ctx.written_for_gpu:
        return
    f = switch_finding(
        ctx,
        "cudnn-benchmark-off",
        "torch.backends.cudnn.benchmark is off for a convolutional net: cuDNN uses a heuristic algorithm "
        "instead of timing the candidates once per input shape.",
        Fix(
            "torch.backends.cudnn.benchmark = True (input shapes fixed from step to step)",
            plan={"cudnn_benchmark": True},
            lightning=lightning_call(cudnn_benchmark=True),
        ),
        measurable=ctx.on_gpu,
    )
    f.provisional("medium" if ctx.on_gpu else "low")
    yield f.on_cpu(ctx)


def cudnn_static(ctx: Context) -> Iterator[Finding]:
    for index in sources(ctx):
        for node in ast.walk(index.tree):
            if (
                isinstance(node, ast.Assign)
                and dotted_name(node.targets[0]).endswith("cudnn.benchmark")
                and is_const(node.value, False)
            ):
                yield static_finding(
                    "cudnn-benchmark-off",
                    index,
                    node,
                    "cudnn.benchmark is switched off explicitly.",
                    Fix(
                        "torch.backends.cudnn.benchmark = True (fixed input shapes)",
                        plan={"cudnn_benchmark": True},
                        lightning=lightning_call(cudnn_benchmark=True),
                    ),
                    speedup=speedup_for_rule("cudnn-benchmark-off"),
                ).on_cpu(ctx)


def edit(ctx: Context, f: Finding) -> EditSpec:
    # The flag is process-wide: the script itself is where it goes, whichever file built the model.
    site = f.site if f.source == "static" else None
    return EditSpec(
        "cudnn_benchmark",
        "torch.backends.cudnn.benchmark = True",
        file=site.file if site is not None else ctx.script,
        line=site.line if site is not None else 0,
    )


RULE = register(
    Rule(
        "cudnn-benchmark-off",
        detect=(
            Detect("live", cudnn_benchmark_off),
            Detect("static", cudnn_static),
        ),
        edit=edit,
        edits_without_site=True,
    )
)
