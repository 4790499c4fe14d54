"""What the memory rules share: sizes in words, and each memory fix said in every framework and as what it measured."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...analysis.memory import size_text
from ...findings import Fix
from ...results import MeasuredFix

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...analysis.memory_fixes import FixCost

__all__ = ["size_text", "fix_for", "measured", "compiled"]


def compiled(ctx: Context) -> bool:
    """Whether the script compiled code: the memory fixes' copies then ran eagerly (analysis/memory_fixes.py)."""
    return ctx.compiled is not None and ctx.compiled.compiled


def measured(cost: FixCost) -> MeasuredFix:
    """What a memory fix measured, its time in ms as the report shows it."""
    return MeasuredFix(
        fix=cost.fix,
        detail=cost.detail,
        baseline_bytes=cost.baseline.peak_bytes,
        fixed_bytes=cost.fixed.peak_bytes,
        baseline_ms=round(cost.baseline.step_seconds * 1e3, 3),
        fixed_ms=round(cost.fixed.step_seconds * 1e3, 3),
    )


def fix_for(fix: str, detail: str) -> Fix:
    """The fix a :class:`~turbotrain.doctor.analysis.memory_fixes.FixCost` measured, in the user's framework."""
    if fix == "micro-batches":
        k = detail.split(" x ")[0]
        return Fix(
            f"split each batch into {k} micro-batches: (loss / {k}).backward() on each, then one optimizer.step()",
            lightning=f"Trainer(accumulate_grad_batches={k}) with a batch {k}x smaller",
            fabric=f"with fabric.no_backward_sync(model, enabled=i % {k} != 0): ... on a batch {k}x smaller",
            accelerate=f"Accelerator(gradient_accumulation_steps={k}) and `with accelerator.accumulate(model):`",
            hf_trainer=f"TrainingArguments(gradient_accumulation_steps={k}, per_device_train_batch_size=batch/{k})",
        )
    if fix == "bf16-autocast":
        return Fix(
            f"with torch.autocast('{detail}', dtype=torch.bfloat16): around the forward and the loss",
            plan={"precision": "bf16"},
            lightning="Trainer(precision='bf16-mixed')",
            fabric="Fabric(precision='bf16-mixed')",
            accelerate="Accelerator(mixed_precision='bf16')",
            hf_trainer="TrainingArguments(bf16=True)",
        )
    if fix == "checkpointing":
        return Fix(
            f"recompute {detail} in the backward: torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) "
            "in the forward that calls it",
            lightning="the same call inside your LightningModule's forward",
            hf_trainer="model.gradient_checkpointing_enable() / TrainingArguments(gradient_checkpointing=True)",
        )
    return Fix("optimizer.zero_grad(set_to_none=True)")
