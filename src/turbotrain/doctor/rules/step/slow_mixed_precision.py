"""`slow-mixed-precision`: the script runs its forward under autocast in a dtype this device has no fast units for
(bfloat16 on a CPU without AVX512-BF16 or AMX, or on a GPU before Ampere; float16 on a CPU), where the casts and the
emulated matmuls make the step slower than float32; float32 against the script's autocast timed on your model.

Reads: model + hardware.
Edit: `enabled=False` on the script's `torch.autocast(...)` calls of that dtype (the one around the training forward,
a `with ctx:` whose `ctx` is bound to one included, and every other in the file with the same `dtype=`): the
forward and the loss in float32 (labelled: it changes numerics).

A CPU's bf16 is judged by its instruction set (`Hardware.bf16`), a GPU's by its compute capability (emulated bf16
counts as none): the rule fires only where the hardware has no fast units for the dtype, and the what-if says by
how much float32 is faster on this model. Until it does (a step too long for the what-if budget), the gain is
estimated from the profiler window's matmul and convolution share of the step and one square matmul timed in both
dtypes on this device.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator

import torch

from ....plan import Plan
from ....speedups.policy import call_text
from ....speedups.registry import by_field
from ...edits import PRECISION, EditSpec
from ...findings import Finding, Fix, lightning_call, speedup_for_rule
from ...rank_change import RankChange
from ...requests import JobRequest, PlanRequest
from ..common import on_a_job
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...cst_tools import Source
    from ...edits import EditRequest


def _slow_dtype(ctx: Context) -> str | None:
    """The autocast dtype the run used, where this device has no fast units for it ("bfloat16", "float16")."""
    facts = ctx.facts
    if not facts.autocast or not facts.autocast_dtype:
        return None
    dtype = str(facts.autocast_dtype).replace("torch.", "")
    if dtype == "bfloat16" and not ctx.hw.bf16:
        return dtype
    if dtype == "float16" and not ctx.hw.fp16:
        return dtype
    return None


# The ops whose time autocast moves to the low-precision units (their self time in the profiler window).
MATMUL_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::mkldnn_convolution",
        "aten::cudnn_convolution",
        "aten::convolution_backward",
    }
)
PROBE_N = {"cpu": 256, "cuda": 4096}  # large enough to be the matmul kernel's time, not the call's


def _matmul_slowdown(dtype: str, device: str) -> float | None:
    """How many times longer an n x n x n matmul takes in ``dtype`` than in float32 here: the fastest of five
    calls each, three interleaved rounds, the median round (None where the device cannot run it)."""
    try:
        a = torch.randn(PROBE_N[device], PROBE_N[device], device=device)
        low = a.to(getattr(torch, dtype))

        def fastest(x: torch.Tensor) -> float:
            best = float("inf")
            for _ in range(5):
                start = time.perf_counter()
                x @ x
                if device == "cuda":
                    torch.cuda.synchronize()  # the kernel's time, not its launch
                best = min(best, time.perf_counter() - start)
            return best

        ratios = sorted(fastest(low) / fastest(a) for _ in range(3))
    except RuntimeError:  # a dtype the device has no matmul for: no estimate, the what-if still times the model
        return None
    return ratios[1]


def _estimate(ctx: Context, f: Finding, dtype: str) -> None:
    """The gain estimated from the matmuls' share of the step and the probe's slowdown, where both are known."""
    ops = ctx.recording.top_ops if ctx.recording is not None else ()
    per_step_ms = sum(
        (op.self_device_ms_per_step if ctx.on_gpu else op.self_cpu_ms_per_step) for op in ops if op.op in MATMUL_OPS
    )
    share = min(1.0, per_step_ms / 1e3 / ctx.step_s) if ctx.step_s > 0 else 0.0
    if share < 0.05:
        return
    device = "cuda" if ctx.on_gpu else "cpu"
    slowdown = _matmul_slowdown(dtype, device)
    if slowdown is None or slowdown <= 1.0:
        return
    f.set_gain(share * (1.0 - 1.0 / slowdown), measured=False)
    n = PROBE_N[device]
    f.note = (
        f"Estimated: matmuls and convolutions take {share:.0%} of the step in the profiler window, and a "
        f"{n}x{n} matmul ran {slowdown:.1f}x slower in {dtype} than in float32 here; the what-if times float32 on "
        f"your model where its budget allows. {f.note}"
    )


def _units(ctx: Context, dtype: str) -> str:
    if ctx.on_gpu:
        return f"{ctx.hw.device_name} has no {dtype} tensor cores (compute capability {ctx.hw.capability})"
    if dtype == "bfloat16":
        return f"{ctx.hw.device_name} has no bf16 instructions (AVX512-BF16 or AMX)"
    return f"{ctx.hw.device_name} has no fast float16 matmuls"


def slow_mixed_precision(ctx: Context) -> Iterator[Finding]:
    job = on_a_job(ctx)  # the ranks' model is not in this process: timed with every rank's autocasts off
    if ctx.model is None and not job:
        return
    dtype = _slow_dtype(ctx)
    if dtype is None or ctx.share("compute") + ctx.share("python_overhead") < 0.25:
        return
    fp32 = Plan(precision="fp32")
    f = Finding(
        "slow-mixed-precision",
        site=ctx.capture.site if ctx.capture else None,
        category="compute",
        speedup=speedup_for_rule("slow-mixed-precision", "precision"),
        message=(
            f"The forward runs under autocast in {dtype}, but {_units(ctx, dtype)}: its matmuls are emulated and "
            f"every op pays casts, so float32 runs the step faster here."
        ),
        fix=Fix(
            f"torch.autocast(..., dtype=torch.{dtype}, enabled=False), or no autocast, on this machine",
            plan={"precision": "fp32"},
            lightning=lightning_call(precision="fp32"),
            accelerate=call_text("Accelerator", by_field("precision").export.accelerate_keys(fp32)),
            fabric=call_text("Fabric", by_field("precision").export.lightning_flags(fp32)),
            hf_trainer=call_text("TrainingArguments", {"bf16" if dtype == "bfloat16" else "fp16": False}),
        ),
        request=JobRequest(RankChange(autocast_off=dtype)) if job else PlanRequest({"precision": "fp32"}),
    )
    f.provisional("medium")
    f.note = (
        "Changes numerics (float32 instead of "
        f"{dtype}); on a device with fast {dtype} units (an Ampere or later GPU, a CPU with AMX) keep autocast on."
    )
    _estimate(ctx, f, dtype)
    yield f


def edit(ctx: Context, f: Finding) -> EditSpec:
    dtype = _slow_dtype(ctx) or "bfloat16"
    return EditSpec(
        "rule",
        f"enabled=False on the torch.autocast(...) calls in {dtype} (this device has no fast {dtype} units)",
        params={"dtype": dtype},
        numerics=PRECISION,
    )


def rewrite(source: Source, req: EditRequest) -> str:
    """``enabled=False`` on the autocast the training forward runs under, and on every other autocast call of the
    file written with the same ``dtype=`` (:func:`._autocast_off.autocast_off`)."""
    from ._autocast_off import autocast_off  # libcst: the fix extra, needed by --fix only

    return autocast_off(source, req)


RULE = register(
    Rule("slow-mixed-precision", detect=(Detect("live", slow_mixed_precision),), edit=edit, rewrite=rewrite)
)
