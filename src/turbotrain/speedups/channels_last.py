"""channels_last (NHWC) memory format for 4D convolution nets and their input images."""

from __future__ import annotations

import torch

from .registry import BenchEntry, Order, Speedup, register


def to_channels_last(model: torch.nn.Module) -> torch.nn.Module:
    """Convert 4D parameters and buffers to NHWC in place (the same Parameter objects)."""
    return model.to(memory_format=torch.channels_last)


def _apply(rt) -> None:
    to_channels_last(rt.module)
    rt.channels_last_inputs = True


def _recommend(hw, info):
    return True if info.n_conv2d else None


ENTRY = register(Speedup(
    name="channels_last", field="channels_last", order=Order.MODEL_LAYOUT, apply=_apply,
    recommend=_recommend, exact=True, doctor_rules=("channels-last",),
    summary="NHWC layout lets convolution kernels (and tensor cores) read contiguous channels",
    bench=BenchEntry(("cnn",), {"channels_last": True}),
))
