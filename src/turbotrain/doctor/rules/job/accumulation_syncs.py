"""`accumulation-syncs`: DDP with gradient accumulation and no `no_sync()` (on a job: `no_sync()` timed on every rank);
FSDP whose recorded reduce-scatters ran in the backward of more than one micro-batch a step (on a job:
`set_requires_gradient_sync(False)`, or the older FSDP's `no_sync()`, on every micro-batch but the last, timed on
every rank).

Reads: run, source.
Applies to: a multi-process job.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Literal

from ...findings import Evidence, Finding, Fix, speedup_for_rule
from ...rank_change import RankChange
from ...requests import JobRequest
from ..common import on_a_job, sources, static_finding
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class AccumulationEvidence(Evidence):
    backwards_per_step: float
    world_size: int
    kind: Literal["ddp", "fsdp"]


def accumulation_syncs(ctx: Context) -> Iterator[Finding]:
    from torch.nn.parallel import DistributedDataParallel

    synced = [c.passes for c in ctx.recording.communication] if ctx.recording is not None else []
    if not synced and not any(isinstance(m, DistributedDataParallel) for m in ctx.modules + [ctx.model]):
        return
    backwards = ctx.backwards_per_step()
    if backwards <= 1.01 or ctx.seen("no_sync") or (synced and max(synced) <= 1):
        return
    site = ctx.capture.site if ctx.capture else None
    fsdp = any(c.kind == "fsdp" and c.passes > 1 for c in ctx.recording.communication) if ctx.recording else False
    sync = "FSDP reduce-scatters them in every one" if fsdp else "DDP all-reduces them after every one"
    f = Finding(
        "accumulation-syncs",
        site=site,
        category="compute",
        speedup=speedup_for_rule("accumulation-syncs"),
        message=(
            f"Gradients are accumulated over {backwards:.0f} backward passes per optimizer step, and {sync} of "
            f"them: {backwards - 1:.0f} of {backwards:.0f} {'reduce-scatters' if fsdp else 'all-reduces'} per step "
            "are wasted."
        ),
        fix=_accumulation_fix(round(backwards), fsdp),
        evidence=AccumulationEvidence(
            backwards_per_step=backwards, world_size=ctx.world_size, kind="fsdp" if fsdp else "ddp"
        ),
    )
    if on_a_job(ctx):
        # Timed on every rank: each forward of a micro-batch but the last runs as under no_sync() (DDP) or
        # set_requires_gradient_sync(False) (FSDP).
        f.request = JobRequest(RankChange(sync_every=round(backwards)))
    if ctx.world_size > 1:
        f.provisional("medium")
    else:
        f.provisional("low")
        f.note = "This run has one process, where the all-reduce is cheap; it costs real time with several."
    yield f


def _accumulation_fix(k: int, fsdp: bool) -> Fix:
    accelerate = f"Accelerator(gradient_accumulation_steps={k}) and `with accelerator.accumulate(model):`"
    hf_trainer = f"TrainingArguments(gradient_accumulation_steps={k})"
    if fsdp:
        return Fix(
            "fully_shard: model.set_requires_gradient_sync(False) before every micro-batch but the last, True "
            "before the last; FullyShardedDataParallel: `with model.no_sync():` around every micro-batch but the "
            "last (both keep unsharded gradients until then: more memory)",
            accelerate=accelerate,
            hf_trainer=hf_trainer,
        )
    return Fix(
        "`with model.no_sync():` around the backward of every micro-batch but the last",
        plan={"grad_accum_steps": k},
        lightning=f"Trainer(accumulate_grad_batches={k}) (skips the sync for you)",
        accelerate=accelerate,
        fabric="`with fabric.no_backward_sync(model):` around the backward of every micro-batch but the last",
        hf_trainer=hf_trainer,
    )


def accumulation_static(ctx: Context) -> Iterator[Finding]:
    for index in sources(ctx):
        if "DistributedDataParallel" not in index.text or "no_sync" in index.text:
            continue
        for call, _ in index.calls("step"):
            parent = index.parents.get(call)
            while parent is not None and not isinstance(parent, ast.If):
                parent = index.parents.get(parent)
            if parent is not None and "%" in ast.unparse(parent.test) and index.in_direct_loop(call):
                yield static_finding(
                    "accumulation-syncs",
                    index,
                    call,
                    "Gradients are accumulated (optimizer step every few iterations) under DDP without "
                    "no_sync(): every micro-batch's backward all-reduces the gradients.",
                    Fix("`with model.no_sync():` for all micro-batches but the last", plan={"grad_accum_steps": 2}),
                    speedup=speedup_for_rule("accumulation-syncs"),
                )
                break


RULE = register(
    Rule(
        "accumulation-syncs",
        detect=(
            Detect("runtime", accumulation_syncs),
            Detect("static", accumulation_static),
        ),
    )
)
