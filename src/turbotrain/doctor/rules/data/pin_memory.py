"""`pin-memory`: pageable loader memory copied to a GPU.

Reads: run.
Applies to: a GPU.
Edit: `pin_memory=True` in that `DataLoader(...)` call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from ...edits import EditSpec
from ...findings import Finding, Fix, speedup_for_rule
from ...requests import CopyRequest
from ..common import loader_edit
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


def pin_memory(ctx: Context) -> Iterator[Finding]:
    record = ctx.main_loader
    if record is None or record.settings["pin_memory"]:
        return
    copies = ctx.site_stats("h2d")
    if ctx.on_gpu:
        share = ctx.share("host_to_device")
        if share < 0.01 or not copies:
            return
    elif not ctx.written_for_gpu:
        return
    else:
        share = None
    f = Finding(
        "pin-memory",
        site=record.site,
        category="host_to_device",
        speedup=speedup_for_rule("pin-memory"),
        message=(
            "The DataLoader hands out pageable memory: each copy to the GPU is staged through a pinned "
            "buffer first and cannot overlap compute." + (f" Copies take {share:.0%} of step time." if share else "")
        ),
        fix=Fix(
            "DataLoader(..., pin_memory=True), then batch.to(device, non_blocking=True)",
            plan={"pin_memory": True},
            lightning="DataLoader(..., pin_memory=True)",
            accelerate="DataLoader(..., pin_memory=True) before accelerator.prepare(...)",
            hf_trainer="TrainingArguments(dataloader_pin_memory=True)",
        ),
        request=CopyRequest() if share else None,
    )
    if share:
        f.set_gain(share, measured=False)
        f.note = "est_speedup is the upper bound: all copy time hidden."
    yield f.on_cpu(ctx)


def edit(ctx: Context, f: Finding) -> EditSpec:
    return loader_edit({"pin_memory": True})


RULE = register(Rule("pin-memory", detect=(Detect("runtime", pin_memory),), edit=edit))
