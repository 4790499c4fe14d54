"""Fused or foreach optimizer kernels: one launch for all parameters instead of one per tensor."""

from __future__ import annotations

import torch
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from .registry import BenchEntry, Order, Speedup, register


def make_fused(optimizer: torch.optim.Optimizer) -> str:
    """Switch ``optimizer`` in place to its fused implementation, else foreach.

    Returns ``"fused"``, ``"foreach"`` or ``"none"`` (the optimizer offers neither, or its
    parameters live where the kernels do not run). The optimizer object, its state and any
    scheduler bound to it are kept.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    fused_ok = "fused" in optimizer.defaults and not optimizer.defaults.get("differentiable") and all(
        p.device.type in _get_fused_kernels_supported_devices() and torch.is_floating_point(p) for p in params)
    if fused_ok:
        for group in [optimizer.defaults, *optimizer.param_groups]:
            group["fused"], group["foreach"] = True, False
        # What the constructor sets for fused=True: GradScaler then passes the scale and the
        # inf flag to the kernel instead of syncing to decide whether to step.
        optimizer._step_supports_amp_scaling = True
        return "fused"
    # foreach also runs on the CPU (torch only defaults to it on accelerators); measured on a
    # 2-core CPU it is still ~1.3x faster than the per-parameter loop for AdamW.
    if "foreach" in optimizer.defaults and not optimizer.defaults.get("differentiable"):
        for group in [optimizer.defaults, *optimizer.param_groups]:
            group["foreach"] = True
        return "foreach"
    return "none"


def _apply(rt) -> None:
    import logging

    for opt in rt.optimizers:
        if make_fused(opt) == "none":
            logging.getLogger("turbotrain").warning(
                "turbotrain: fused_optimizer: %s has neither a fused nor a foreach implementation here; unchanged",
                type(opt).__name__)


def _recommend(hw, info):
    return True


ENTRY = register(Speedup(
    name="fused_optimizer", field="fused_optimizer", order=Order.OPTIMIZER, apply=_apply, recommend=_recommend,
    exact=True, doctor_rules=("non-foreach-optimizer",),
    summary="one fused kernel updates every parameter",
    bench=BenchEntry(("gpt", "mlp"), {"fused_optimizer": True}),
))
