"""channels_last (NHWC) memory format for 4D convolution nets and their input images."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .model_info import CONV_NET
from .policy import Export, timed
from .registry import BenchEntry, Order, Speedup, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime import Runtime


def to_channels_last(model: torch.nn.Module) -> torch.nn.Module:
    """Convert 4D parameters and buffers to NHWC in place (the same Parameter objects)."""
    return model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # accepted, not in the stub


def _apply(rt: Runtime) -> None:
    to_channels_last(rt.module)
    rt.channels_last_inputs = True


def _code(plan, framework: str) -> list[str]:
    # Neither Lightning nor Accelerate has a layout flag: the model and its images are converted in code.
    if not plan.channels_last:
        return []
    return [
        "model = model.to(memory_format=torch.channels_last)  # and images: "
        "x.contiguous(memory_format=torch.channels_last)"
    ]


ENTRY = register(
    Speedup(
        name="channels_last",
        field="channels_last",
        order=Order.MODEL_LAYOUT,
        apply=_apply,
        recommend=lambda hw, info: True,
        exact=True,
        doctor_rules=("channels-last",),
        summary="NHWC layout lets convolution kernels (and tensor cores) read contiguous channels",
        bench=BenchEntry(("cnn",), {"channels_last": True}),
        # NHWC only changes how 4D activations are laid out: a model that is not a conv net has little to gain.
        applies_to=CONV_NET,
        tune=timed(),
        export=Export(code=_code),
    )
)
