"""Mixed and low precision: bf16/fp16 autocast (fp16 with a GradScaler), or bf16 weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .model_info import ANY_MODEL
from .policy import Export, timed
from .registry import BenchEntry, Order, Speedup, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime import Runtime

AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a precision setting (None for fp32 and bf16-true)."""
    return AUTOCAST_DTYPES.get(precision)


def make_grad_scaler(device: torch.device | str):
    """A GradScaler: fp16 gradients underflow without loss scaling."""
    return torch.amp.GradScaler(torch.device(device).type)


def cast_to_bf16(model: torch.nn.Module) -> torch.nn.Module:
    """bf16 weights (half the memory); parameters stay the same objects for the optimizer."""
    return model.to(torch.bfloat16)


def _apply(rt: Runtime) -> None:
    precision = rt.plan.precision
    if precision == "bf16-true":
        cast_to_bf16(rt.module)
        rt.cast_inputs = torch.bfloat16
        return
    rt.autocast_dtype = autocast_dtype(precision)
    if precision == "fp16-mixed":
        rt.scaler = make_grad_scaler(rt.device)


def _requires(hw, plan) -> str | None:
    if plan.precision == "fp16-mixed" and not hw.is_cuda:
        return (
            "fp16-mixed needs a CUDA GPU (CPUs have no fp16 matrix units and no GradScaler path); "
            "use precision='bf16-mixed' on CPU"
        )
    if plan.precision in ("bf16-mixed", "bf16-true") and hw.is_cuda and not hw.bf16:
        return f"{hw.device_name} has no bf16 support; use precision='fp16-mixed'"
    return None


# Below this size a CPU step is bound by per-op overhead, which autocast's casts only add to:
# measured on a 2-core AVX512-BF16 CPU, bf16 made a 2.8k-parameter MLP 0.77x as fast while a
# 0.3M-parameter CNN and a 0.45M-parameter GPT gained 1.9x and 1.15x.
CPU_BF16_MIN_PARAMS = 100_000


def _recommend(hw, info):
    if hw.is_cuda:
        return "bf16-mixed" if hw.bf16 else ("fp16-mixed" if hw.fp16 else None)
    if hw.bf16 and (info.n_params == 0 or info.n_params >= CPU_BF16_MIN_PARAMS):
        return "bf16-mixed"
    return None


# bf16-true trains bf16 *weights*: small updates round away over a long run, which a trial of a few
# steps cannot show, so it is a memory choice the user makes and the tuner never times it.
TUNED_PRECISIONS = ("bf16-mixed", "fp16-mixed")

LIGHTNING_PRECISION = {
    "fp32": "32-true",
    "bf16-mixed": "bf16-mixed",
    "fp16-mixed": "16-mixed",
    "bf16-true": "bf16-true",
}
ACCELERATE_PRECISION = {"fp32": "no", "bf16-mixed": "bf16", "fp16-mixed": "fp16", "bf16-true": "bf16"}


def _code(plan, framework: str) -> list[str]:
    # Accelerate's bf16 is autocast only: bf16 weights are a cast in code.
    if plan.precision != "bf16-true" or framework != "accelerate":
        return []
    return ["model = model.to(torch.bfloat16)  # bf16 weights (the config's bf16 is autocast)"]


ENTRY = register(
    Speedup(
        name="precision",
        field="precision",
        order=Order.MODEL_DTYPE,
        apply=_apply,
        requires=_requires,
        recommend=_recommend,
        exact=False,
        doctor_rules=("no-mixed-precision", "slow-mixed-precision"),
        summary="bf16/fp16 autocast runs matmuls and convolutions on low-precision units",
        bench=BenchEntry(("gpt", "cnn"), {"precision": "bf16-mixed"}),
        applies_to=ANY_MODEL,
        tune=timed(lambda hw, base: TUNED_PRECISIONS),
        export=Export(
            lightning=lambda plan: {"precision": LIGHTNING_PRECISION[plan.precision]},
            accelerate=lambda plan: {"mixed_precision": ACCELERATE_PRECISION[plan.precision]},
            code=_code,
        ),
    )
)
