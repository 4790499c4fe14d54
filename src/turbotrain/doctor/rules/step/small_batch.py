"""`small-batch`: small batches and dispatch overhead dominates (larger batch timed).

Reads: model + run (the rule table in docs/doctor.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from ...findings import Finding, Fix, speedup_for_rule
from ...requests import BatchRequest
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


def small_batch(ctx: Context) -> Iterator[Finding]:
    batch = ctx.facts.batch_size or (ctx.capture.batch_size if ctx.capture else None)
    overhead = ctx.dispatch_share()
    if not batch or ctx.capture is None or batch > 32 or overhead < 0.25:
        return
    f = Finding(
        "small-batch",
        site=ctx.main_loader.site if ctx.main_loader else ctx.capture.site,
        category="compute",
        speedup=speedup_for_rule("small-batch"),
        message=(
            f"Batches of {batch} sample(s) leave the step bound by per-op overhead ({overhead:.0%} of step "
            "time is dispatching ops, not computing): a larger batch does more work per op."
        ),
        fix=Fix(
            "Raise the batch size (the largest that fits; rescale the learning rate) or accumulate several "
            "samples per forward",
            plan={"batch_size": 8 * max(1, batch)},
            lightning="DataLoader(batch_size=...); Trainer(accumulate_grad_batches=k) keeps the effective size",
            accelerate="DataLoader(batch_size=...)",
            hf_trainer="TrainingArguments(per_device_train_batch_size=...); gradient_accumulation_steps=k keeps "
            "the effective size",
        ),
        evidence={"batch_size": batch, "python_overhead_share": round(overhead, 3)},
        request=BatchRequest(),
    )
    f.provisional("medium")
    f.note = "A larger batch changes the optimisation (rescale the learning rate); est_speedup is samples/s."
    yield f


RULE = register(Rule("small-batch", detect=(Detect("live", small_batch),)))
