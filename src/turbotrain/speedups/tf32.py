"""TF32: fp32 matmuls and convolutions on tensor cores (10-bit mantissa inputs, fp32 accumulate)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .model_info import ANY_MODEL
from .policy import Export, timed
from .registry import BenchEntry, Order, Speedup, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime import Runtime


def set_tf32(enabled: bool = True) -> None:
    """Process-wide switch for CUDA matmuls and cuDNN convolutions."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def _apply(rt: Runtime) -> None:
    set_tf32(True)


def _requires(hw, plan) -> str | None:
    return None if hw.tf32 else "TF32 needs an NVIDIA Ampere or newer GPU"


def _recommend(hw, info):
    return True if hw.tf32 else None


ENTRY = register(
    Speedup(
        name="tf32",
        field="tf32",
        order=Order.GLOBAL,
        apply=_apply,
        requires=_requires,
        recommend=_recommend,
        exact=False,
        doctor_rules=("no-mixed-precision",),
        summary="TF32 tensor cores for whatever still runs in fp32",
        bench=BenchEntry(("gpt", "cnn"), {"tf32": True}),
        applies_to=ANY_MODEL,
        tune=timed(),
        export=Export(
            code=lambda plan, framework: (
                ['torch.set_float32_matmul_precision("high")  # TF32 matmuls'] if plan.tf32 else []
            )
        ),
    )
)
