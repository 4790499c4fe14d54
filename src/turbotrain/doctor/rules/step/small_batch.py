"""`small-batch`: small batches and dispatch overhead dominates: a larger batch (up to 8x) proposed and timed only at
the largest multiple whose estimated peak fits the device (90% of it), with the memory it needs against what the
device has.

Reads: model + run + memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...analysis.memory import capacity_bytes, size_text
from ...findings import Evidence, Finding, Fix, speedup_for_rule
from ...requests import BatchRequest
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...record.memory_watch import StepMemory

# The share of the device's memory a larger batch may plan for: the allocator, the loader and the rest need some.
HEADROOM = 0.9


@dataclass(frozen=True)
class LargerBatchMemory(Evidence):
    """What a larger batch would need at the step's peak, against what the device has."""

    batch_size: int
    needs_bytes: int
    measured_peak_bytes: int
    capacity_bytes: int | None
    device: str
    fits: bool


@dataclass(frozen=True)
class SmallBatchEvidence(Evidence):
    batch_size: int
    python_overhead_share: float
    memory: LargerBatchMemory | None = None  # where the step's memory was measured


def larger_factor(batch: int) -> int:
    """The multiple of the script's batch to propose and time: 8x, at least 2x, up to 64 samples."""
    return max(2, min(8, 64 // max(1, batch)))


def _fitting(memory: StepMemory, batch: int, factor: int) -> tuple[int, LargerBatchMemory]:
    """The largest multiple of ``batch`` up to ``factor`` whose estimated peak fits the device (0: not even 2x), and
    the figures that say so."""
    capacity = capacity_bytes(memory)
    fitting = factor
    if capacity is not None:
        fits = [k for k in range(factor, 1, -1) if memory.at_rows(batch, batch * k) <= HEADROOM * capacity]
        fitting = fits[0] if fits else 0
    shown = fitting or 2  # where none fits, what the smallest larger batch would need
    said = LargerBatchMemory(
        batch_size=batch * shown,
        needs_bytes=memory.at_rows(batch, batch * shown),
        measured_peak_bytes=memory.peak_bytes,
        capacity_bytes=capacity,
        device=memory.memory.device,
        fits=bool(fitting),
    )
    return fitting, said


def _memory_text(memory: LargerBatchMemory, batch: int) -> str:
    room = (
        "not known"
        if memory.capacity_bytes is None
        else f"{size_text(memory.capacity_bytes)} of RAM available"
        if memory.device == "cpu"
        else f"{size_text(memory.capacity_bytes)} on {memory.device}"
    )
    said = (
        f" A batch of {memory.batch_size} needs about {size_text(memory.needs_bytes)} at the step's peak "
        f"(the batch-sized part of the {size_text(memory.measured_peak_bytes)} measured at {batch}, scaled), "
        f"against {room}"
    )
    return said + (": it fits." if memory.fits else ": it does not fit; accumulate gradients instead.")


def small_batch(ctx: Context) -> Iterator[Finding]:
    batch = ctx.facts.batch_size or (ctx.capture.batch_size if ctx.capture else None)
    overhead = ctx.dispatch_share()
    if not batch or ctx.capture is None or batch > 32 or overhead < 0.25:
        return
    factor = larger_factor(batch)
    memory = ctx.step_memory
    fitting = None
    if memory is not None:
        factor, fitting = _fitting(memory, batch, factor)
    said = _memory_text(fitting, batch) if fitting is not None else ""
    f = Finding(
        "small-batch",
        site=ctx.main_loader.site if ctx.main_loader else ctx.capture.site,
        category="compute",
        speedup=speedup_for_rule("small-batch"),
        message=(
            f"Batches of {batch} sample(s) leave the step bound by per-op overhead ({overhead:.0%} of step "
            "time is dispatching ops, not computing): a larger batch does more work per op." + said
        ),
        fix=Fix(
            (
                f"Feed {batch * factor} samples per forward: stack that many inputs into one batch (in reinforcement "
                f"learning, step {batch * factor} environments at once, e.g. gymnasium.vector.SyncVectorEnv, and act "
                "on their stacked observations); rescale the learning rate"
                if factor and ctx.capture.unbatched
                else f"Raise the batch size to {batch * factor} (rescale the learning rate) or accumulate several "
                "samples per forward"
                if factor
                else "Accumulate gradients over several micro-batches (a larger batch does not fit in memory)"
            ),
            plan={"batch_size": batch * factor} if factor else None,
            lightning="DataLoader(batch_size=...); Trainer(accumulate_grad_batches=k) keeps the effective size",
            accelerate="DataLoader(batch_size=...)",
            hf_trainer="TrainingArguments(per_device_train_batch_size=...); gradient_accumulation_steps=k keeps "
            "the effective size",
        ),
        evidence=SmallBatchEvidence(batch_size=batch, python_overhead_share=round(overhead, 3), memory=fitting),
        # Only a batch that fits is timed: a trial of one that does not would end in an out-of-memory error.
        request=BatchRequest(factor) if factor else None,
    )
    f.provisional("medium" if factor else "low")
    f.note = "A larger batch changes the optimisation (rescale the learning rate); est_speedup is samples/s."
    yield f


RULE = register(Rule("small-batch", detect=(Detect("live", small_batch),)))
