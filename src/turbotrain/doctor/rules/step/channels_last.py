"""`channels-last`: a conv net in NCHW (timed): neither its images nor its conv weights are channels_last (torch's
convolution computes NHWC where either is).

Reads: model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from ...findings import Finding, Fix
from ..common import for_this_model, switch_finding
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


def channels_last(ctx: Context) -> Iterator[Finding]:
    facts = ctx.facts
    if not for_this_model(ctx, "channels_last") or facts.input_channels_last or facts.weights_channels_last:
        return
    if not any(len(s) == 4 for s in facts.input_shapes):
        return
    f = switch_finding(
        ctx,
        "channels-last",
        "The conv net runs in NCHW (channels-first) layout; convolution kernels, tensor cores and oneDNN on "
        "CPUs read NHWC (channels_last) faster.",
        Fix(
            "model = model.to(memory_format=torch.channels_last); "
            "images = images.to(memory_format=torch.channels_last)",
            plan={"channels_last": True},
        ),
    )
    f.provisional("medium" if ctx.on_gpu and ctx.facts.autocast else "low")
    yield f


RULE = register(Rule("channels-last", detect=(Detect("live", channels_last),)))
