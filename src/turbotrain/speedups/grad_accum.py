"""Gradient accumulation: several micro-batches per optimizer step, synchronized only at the last."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .model_info import ANY_MODEL
from .policy import Export, by_finder
from .registry import BenchEntry, Order, Speedup, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime import Runtime


def is_last_micro_batch(index: int, accum_steps: int, total: int | None = None) -> bool:
    """Whether micro-batch ``index`` (0-based within the epoch) ends an optimizer step.

    The epoch's last batch always ends one, so no gradient is carried into the next epoch.
    """
    return (index + 1) % accum_steps == 0 or (total is not None and index + 1 == total)


def _apply(rt: Runtime) -> None:
    rt.accum_steps = rt.plan.grad_accum_steps


def _code(plan, framework: str) -> list[str]:
    # Lightning has a Trainer flag; Accelerate takes it in the Accelerator, not in its config file.
    if plan.grad_accum_steps == 1 or framework != "accelerate":
        return []
    return [f"accelerator = Accelerator(gradient_accumulation_steps={plan.grad_accum_steps})"]


ENTRY = register(
    Speedup(
        name="grad_accum",
        field="grad_accum_steps",
        order=Order.STEP,
        apply=_apply,
        exact=True,
        doctor_rules=("accumulation-syncs",),
        summary="a large effective batch from small micro-batches, one gradient all-reduce per step",
        bench=BenchEntry(("mlp",), {"grad_accum_steps": 4}, script="benchmarks/accumulation.py"),
        applies_to=ANY_MODEL,
        tune=by_finder("batch-size finder (keeps the effective batch when asked)"),
        export=Export(lightning=lambda plan: {"accumulate_grad_batches": plan.grad_accum_steps}, code=_code),
    )
)
