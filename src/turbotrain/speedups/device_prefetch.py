"""Device prefetch: copy batch k+1 on a side CUDA stream while batch k computes."""

from __future__ import annotations

from ..data.prefetch import DeviceLoader
from .registry import BenchEntry, Order, Speedup, register

__all__ = ["DeviceLoader"]


def _apply(rt) -> None:
    rt.device_prefetch = True
    rt.non_blocking = True  # a prefetch that blocks the host would overlap nothing


def _requires(hw, plan) -> str | None:
    return None if hw.is_cuda else "device prefetch overlaps copies to a GPU and this run is on the CPU"


def _recommend(hw, info):
    return True if hw.is_cuda else None


ENTRY = register(Speedup(
    name="device_prefetch", field="device_prefetch", order=Order.STEP, apply=_apply, requires=_requires,
    recommend=_recommend, exact=True, doctor_rules=("non-blocking",),
    summary="the next batch is already on the GPU when the step starts",
    bench=BenchEntry(("cnn",), {"device_prefetch": True, "pin_memory": True}),
))
