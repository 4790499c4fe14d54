"""SyncBatchNorm: batch statistics across all processes (refused together with torch.compile)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from .. import distributed as tdist
from ..config import ConfigError
from .model_info import ANY_MODEL
from .policy import Export, not_tuned
from .registry import BenchEntry, Order, Speedup, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime import Runtime

# PyTorch's SyncBatchNorm raises in forward for any other device type.
_SYNC_DEVICES = ("cuda", "xpu", "hpu")


def convert_sync_batchnorm(model: nn.Module) -> nn.Module:
    """Every BatchNorm*d becomes a SyncBatchNorm sharing the same parameters and buffers."""
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)


def check_compile_conflict(plan) -> None:
    """The compile article's pitfall: refuse SyncBatchNorm + compile unless the user forces it."""
    if plan.sync_batchnorm is True and plan.compile is not False:
        raise ConfigError(
            "Plan.sync_batchnorm=true together with compile is refused: every SyncBatchNorm layer is a "
            "cross-process synchronisation point that breaks the compiled graph, which cancels what compile "
            "buys. Drop one of the two, or set sync_batchnorm='force' to run it anyway."
        )


def _apply(rt: Runtime) -> None:
    rt.module = convert_sync_batchnorm(rt.module)
    rt.model = rt.module


def _requires(hw, plan) -> str | None:
    check_compile_conflict(plan)  # an error, not a skip: the user asked for two things that do not mix
    if tdist.world_size() < 2:
        return "SyncBatchNorm only differs from BatchNorm with several processes; this run has one"
    if hw.device_type not in _SYNC_DEVICES:
        return (
            f"PyTorch's SyncBatchNorm runs on {'/'.join(_SYNC_DEVICES)} only, not {hw.device_type}; "
            "BatchNorm stays per process"
        )
    return None


ENTRY = register(
    Speedup(
        name="sync_batchnorm",
        field="sync_batchnorm",
        order=Order.MODEL_SYNC,
        apply=_apply,
        requires=_requires,
        exact=False,
        doctor_rules=("syncbn-with-compile",),
        summary="global batch statistics for small per-GPU batches (accuracy, not speed)",
        bench=BenchEntry(("cnn",), {"sync_batchnorm": True, "strategy": "ddp"}, script="benchmarks/ddp.py"),
        applies_to=ANY_MODEL,
        tune=not_tuned("changes batch statistics across processes (accuracy, not speed)"),
        export=Export(lightning=lambda plan: {"sync_batchnorm": bool(plan.sync_batchnorm)}),
    )
)
