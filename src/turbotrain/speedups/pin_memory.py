"""Pinned (page-locked) host memory for batches: faster and asynchronous host-to-device copies."""

from __future__ import annotations

from .registry import BenchEntry, Order, Speedup, register


def _apply(rt) -> None:
    rt.loader_overrides["pin_memory"] = rt.plan.pin_memory


def _requires(hw, plan) -> str | None:
    if plan.pin_memory and not hw.is_cuda:
        return "pinned memory only speeds up copies to a GPU and this run is on the CPU"
    return None


def _recommend(hw, info):
    return True if hw.is_cuda else None


ENTRY = register(Speedup(
    name="pin_memory", field="pin_memory", order=Order.LOADER, apply=_apply, requires=_requires,
    recommend=_recommend, exact=True, doctor_rules=("pin-memory",),
    summary="DMA copies from page-locked memory, no staging copy",
    bench=BenchEntry(("cnn",), {"pin_memory": True}),
))
