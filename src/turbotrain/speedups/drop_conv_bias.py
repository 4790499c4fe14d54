"""Remove convolution biases that a following BatchNorm cancels (an exact rewrite)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .model_info import CONV_BN_PAIRS, find_conv_bn_pairs
from .policy import Export, timed
from .registry import BenchEntry, Order, Speedup, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime import Runtime


@torch.no_grad()
def drop_conv_bias_before_bn(model: nn.Module, optimizers=()) -> list[str]:
    """Drop the bias of every conv whose output feeds only a BatchNorm; returns the conv names.

    BatchNorm subtracts the batch mean, so a constant per-channel bias before it has no
    effect in training. To keep evaluation identical too, the bias is folded into the
    running mean (running_mean - bias is what the statistics would have been without it).
    The removed parameters are also taken out of ``optimizers``.
    """
    modules = dict(model.named_modules())
    removed: list[nn.Parameter] = []
    names = []
    for conv_name, bn_name in find_conv_bn_pairs(model):
        conv, bn = modules[conv_name], modules[bn_name]
        bn.running_mean.sub_(conv.bias.to(bn.running_mean.dtype))
        removed.append(conv.bias)
        conv.register_parameter("bias", None)
        names.append(conv_name)
    gone = {id(p) for p in removed}
    for opt in optimizers:
        for group in opt.param_groups:
            group["params"] = [p for p in group["params"] if id(p) not in gone]
        for p in removed:
            opt.state.pop(p, None)
    return names


def _apply(rt: Runtime) -> None:
    drop_conv_bias_before_bn(rt.module, rt.optimizers)


def _code(plan, framework: str) -> list[str]:
    if not plan.drop_conv_bias:
        return []
    return [
        "from turbotrain.speedups.drop_conv_bias import drop_conv_bias_before_bn; "
        "drop_conv_bias_before_bn(model)  # before building the optimizer"
    ]


ENTRY = register(
    Speedup(
        name="drop_conv_bias",
        field="drop_conv_bias",
        order=Order.MODEL_REWRITE,
        apply=_apply,
        recommend=lambda hw, info: True,
        exact=True,
        doctor_rules=("conv-bias-before-bn",),
        summary="no wasted bias add (and its gradient) before each BatchNorm",
        bench=BenchEntry(("cnn",), {"drop_conv_bias": True}),
        applies_to=CONV_BN_PAIRS,
        tune=timed(),
        export=Export(code=_code),
    )
)
