"""cudnn.benchmark: cuDNN times its algorithms once per input shape and keeps the fastest."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .model_info import CONV_NET
from .policy import Export, timed
from .registry import BenchEntry, Order, Speedup, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime import Runtime


def set_cudnn_benchmark(enabled: bool = True) -> None:
    """Process-wide switch; worth it when input shapes do not change from step to step."""
    torch.backends.cudnn.benchmark = enabled


def _apply(rt: Runtime) -> None:
    set_cudnn_benchmark(True)


def _requires(hw, plan) -> str | None:
    return None if hw.cudnn else "cuDNN is a CUDA library and this run is on the CPU"


def _recommend(hw, info):
    return True if hw.cudnn else None


ENTRY = register(
    Speedup(
        name="cudnn_benchmark",
        field="cudnn_benchmark",
        order=Order.GLOBAL,
        apply=_apply,
        requires=_requires,
        recommend=_recommend,
        exact=True,
        doctor_rules=("cudnn-benchmark-off",),
        summary="cuDNN autotunes convolution algorithms for static shapes",
        bench=BenchEntry(("cnn",), {"cudnn_benchmark": True}),
        # cuDNN's algorithm search is for convolutions: other models have nothing for it to time.
        applies_to=CONV_NET,
        tune=timed(),
        export=Export(lightning=lambda plan: {"benchmark": plan.cudnn_benchmark}),
    )
)
