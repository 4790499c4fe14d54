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
from typing import TYPE_CHECKING, Iterator, cast

import libcst as cst
import torch

from ....plan import Plan
from ....speedups.policy import call_text
from ....speedups.registry import by_field
from ...cst_tools import code_of, dotted, keyword_value, replace, set_keyword
from ...edits import PRECISION, ByHand, EditSpec
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


# torch's autocast entry points and where each takes ``enabled`` and ``dtype`` positionally. A framework's own
# ``accelerator.autocast()``/``fabric.autocast()`` takes neither: its precision flag is the fix there.
_POSITIONS = {
    "torch.autocast": (2, 1),
    "torch.amp.autocast": (2, 1),
    "amp.autocast": (2, 1),
    "autocast": (
        2,
        1,
    ),  # from torch import autocast (torch.cuda.amp's takes enabled first: positional ones are refused)
    "torch.cuda.amp.autocast": (0, 1),
    "torch.cpu.amp.autocast": (0, 1),
}


def _autocast_calls(node: cst.CSTNode) -> list[cst.Call]:
    """torch's autocast calls in ``node`` (``torch.autocast``, ``torch.amp.autocast``, ``torch.cuda.amp.autocast``,
    a bare imported ``autocast``)."""
    found: list[cst.Call] = []

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if dotted(call.func) in _POSITIONS:
                found.append(call)

    node.visit(_Calls())
    return found


def _bound_to(source: Source, name: str) -> list[cst.Call]:
    """The autocast calls in the values the file assigns to ``name`` (``ctx = nullcontext() if ... else
    torch.amp.autocast(...)``; ``with ctx:`` enters it)."""
    calls: list[cst.Call] = []
    for node in source.nodes(cst.Assign):
        if any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets):
            calls += _autocast_calls(node.value)
    for ann in source.nodes(cst.AnnAssign):
        if isinstance(ann.target, cst.Name) and ann.target.value == name and ann.value is not None:
            calls += _autocast_calls(ann.value)
    return calls


def _around(source: Source, req: EditRequest) -> list[cst.Call]:
    """The autocast calls the ``with`` statements around the finding's line enter, innermost first."""
    statement = source.statement_line(req.line)
    for node in [statement, *source.ancestors(statement)]:
        if not isinstance(node, cst.With):
            continue
        for item in node.items:
            value = item.item
            calls = _bound_to(source, value.value) if isinstance(value, cst.Name) else _autocast_calls(value)
            if calls:
                return calls
    return []


def _positional(call: cst.Call) -> list[cst.Arg]:
    return [a for a in call.args if a.keyword is None and not a.star]


def _dtype_of(call: cst.Call) -> str | None:
    arg = keyword_value(call, "dtype")
    if arg is None:
        at = _POSITIONS[dotted(call.func)][1]
        args = _positional(call)
        arg = args[at] if len(args) > at else None
    return code_of(arg.value) if arg is not None else None


def _off_already(call: cst.Call) -> bool:
    enabled = keyword_value(call, "enabled")
    return enabled is not None and code_of(enabled.value) == "False"


def rewrite(source: Source, req: EditRequest) -> str:
    """``enabled=False`` on the autocast the training forward runs under, and on every other autocast call of the
    file written with the same ``dtype=`` (the same device, the same slow units); calls already off are left."""
    around = _around(source, req)
    if not around:
        raise ByHand(
            f"{req.where}: no `with torch.autocast(...)` around the forward in this file (a framework's precision "
            "setting, a decorator or a caller turns it on); switch it off there (float32 / precision='32-true')"
        )
    dtypes = {_dtype_of(c) for c in around}
    # A dtype left to the device's default says nothing of which other calls share it: only those around.
    likes = [c for c in _autocast_calls(source.module) if _dtype_of(c) in dtypes] if None not in dtypes else []
    calls = [c for c in {id(c): c for c in [*around, *likes]}.values() if not _off_already(c)]
    where = f"{source.name}:{req.line}"
    for call in calls:
        enabled = keyword_value(call, "enabled")
        if enabled is not None and code_of(enabled.value) != "True":
            raise ByHand(
                f"{source.name}:{source.lines(call)[0]}: autocast is turned on by `enabled={code_of(enabled.value)}`; "
                "turn that off on this machine"
            )
        name = dotted(call.func)
        if name == "autocast" and len(_positional(call)) > 1:
            raise ByHand(
                f"{source.name}:{source.lines(call)[0]}: `autocast` takes positional arguments here, and which "
                "autocast it is (torch's or torch.cuda.amp's) decides what they mean; add enabled=False by hand"
            )

    def off(node: cst.CSTNode) -> cst.Call:
        call = cast(cst.Call, node)
        return set_keyword(call, "enabled", "False", _POSITIONS[dotted(call.func)][0], where)

    if not calls:
        raise ByHand(f"{where}: the autocast around the forward is already off (enabled=False)")
    return replace(source, {call: off for call in calls})


RULE = register(
    Rule("slow-mixed-precision", detect=(Detect("live", slow_mixed_precision),), edit=edit, rewrite=rewrite)
)
