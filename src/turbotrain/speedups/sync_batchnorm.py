"""SyncBatchNorm: batch statistics across all processes (refused together with torch.compile)."""

from __future__ import annotations

from torch import nn

from .. import distributed as tdist
from ..config import ConfigError
from .registry import BenchEntry, Order, Speedup, register


def convert_sync_batchnorm(model: nn.Module) -> nn.Module:
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)


def _apply(rt) -> None:
    plan = rt.plan
    if plan.compile is not False and plan.sync_batchnorm != "force":
        raise ConfigError(
            "Plan.sync_batchnorm=true together with compile is refused: every SyncBatchNorm layer is a "
            "cross-process synchronisation point that breaks the compiled graph, which cancels what compile "
            "buys. Drop one of the two, or set sync_batchnorm='force' to run it anyway.")
    rt.module = convert_sync_batchnorm(rt.module)
    rt.model = rt.module


def _requires(hw, plan) -> str | None:
    if tdist.world_size() < 2:
        return "SyncBatchNorm only differs from BatchNorm with several processes; this run has one"
    return None


ENTRY = register(Speedup(
    name="sync_batchnorm", field="sync_batchnorm", order=Order.MODEL_SYNC, apply=_apply, requires=_requires,
    exact=False, doctor_rules=("syncbn-with-compile",),
    summary="global batch statistics for small per-GPU batches (accuracy, not speed)",
    bench=BenchEntry(("cnn",), {"sync_batchnorm": True, "strategy": "ddp"}, script="benchmarks/ddp.py"),
))
