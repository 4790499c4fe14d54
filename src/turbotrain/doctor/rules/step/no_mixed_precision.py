"""`no-mixed-precision`: fp32 without autocast on bf16/fp16-capable hardware (timed).

Reads: model + hardware.
Edit: `with torch.autocast(device, dtype=torch.bfloat16):` around the forward and the loss (labelled: it changes
numerics).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from ....plan import Plan, Precision
from ....speedups.policy import call_text
from ....speedups.registry import by_field
from ...edits import PRECISION, ByHand, EditSpec
from ...findings import Finding, Fix, lightning_call, speedup_for_rule
from ...rank_change import RankChange
from ...requests import JobRequest, PlanRequest
from ..common import on_a_job
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ....hardware import Hardware
    from ...analysis.context import Context


def _precision_for(hw: Hardware) -> Precision | None:
    if hw.bf16:
        return "bf16-mixed"
    if hw.fp16:
        return "fp16-mixed"
    return None


def no_mixed_precision(ctx: Context) -> Iterator[Finding]:
    facts = ctx.facts
    job = on_a_job(ctx)  # the ranks' model is not in this process: the fix is timed on every rank
    if (ctx.model is None and not job) or facts.autocast or "16" in facts.param_dtype:
        return
    precision = _precision_for(ctx.hw)
    if precision is None or ctx.share("compute") + ctx.share("python_overhead") < 0.25:
        return
    dtype = "torch.bfloat16" if precision == "bf16-mixed" else "torch.float16"
    # Autocast leaves float64 ops in float64: on a float64 model the switch changes nothing until the model is
    # float32, which only its author can say its numerics allow. Kept for the reports, folded in the terminal.
    float64 = facts.param_dtype == "torch.float64"
    f = Finding(
        "no-mixed-precision",
        site=ctx.capture.site if ctx.capture else None,
        category="compute",
        speedup=speedup_for_rule("no-mixed-precision", "precision"),
        message=(
            f"The model computes in {facts.param_dtype.replace('torch.', '')} without autocast; "
            f"{ctx.hw.device_name} runs {dtype.replace('torch.', '')} matmuls and convolutions faster."
        ),
        fix=Fix(
            f"with torch.autocast('{ctx.device}', dtype={dtype}): around forward and loss"
            + (" plus torch.amp.GradScaler for float16" if precision == "fp16-mixed" else ""),
            plan={"precision": precision},
            lightning=lightning_call(precision=precision),
            accelerate=call_text(
                "Accelerator", by_field("precision").export.accelerate_keys(Plan(precision=precision))
            ),
            fabric=call_text("Fabric", by_field("precision").export.lightning_flags(Plan(precision=precision))),
            hf_trainer=call_text("TrainingArguments", {"bf16" if precision == "bf16-mixed" else "fp16": True}),
        ),
        request=None if float64 else _precision_request(precision, job),
    )
    if float64:
        f.provisional("low")
        f.fold = "float64"
        f.note = (
            "The model computes in float64, which autocast leaves as it is: mixed precision needs the model in "
            "float32 first (model.float()), if its numerics allow; float32 alone is then faster than float64."
        )
        yield f
        return
    f.provisional("medium" if ctx.on_gpu else "low")
    f.note = "Changes numerics slightly (bf16 keeps fp32's range); check the loss curve."
    yield f


def _precision_request(precision: Precision, job: bool) -> PlanRequest | JobRequest | None:
    if not job:
        return PlanRequest({"precision": precision})
    # bf16 only: float16 needs a GradScaler around the backward and the step, which a forward's wrapper is not.
    return JobRequest(RankChange(autocast="bfloat16")) if precision == "bf16-mixed" else None


def edit(ctx: Context, f: Finding) -> EditSpec:
    if (f.fix.plan or {}).get("precision") != "bf16-mixed":
        raise ByHand(
            "float16 needs a torch.amp.GradScaler around the backward and the step as well; add "
            "autocast and the scaler by hand"
        )
    return EditSpec(
        "autocast",
        f"torch.autocast({ctx.device!r}, dtype=torch.bfloat16) around the forward and loss (changes numerics)",
        params={"device": ctx.device, "dtype": "bfloat16"},
        numerics=PRECISION,
    )


RULE = register(Rule("no-mixed-precision", detect=(Detect("live", no_mixed_precision),), edit=edit))
