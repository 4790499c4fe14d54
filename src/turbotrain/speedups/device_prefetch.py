"""Device prefetch: copy batch k+1 on a side CUDA stream while batch k computes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..data.prefetch import DeviceLoader
from .model_info import ANY_MODEL
from .policy import Export, by_rule
from .registry import BenchEntry, Order, Speedup, gpu_only, on_gpu, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime import Runtime

__all__ = ["DeviceLoader"]


def _apply(rt: Runtime) -> None:
    rt.device_prefetch = True
    rt.non_blocking = True  # a prefetch that blocks the host would overlap nothing


ENTRY = register(
    Speedup(
        name="device_prefetch",
        field="device_prefetch",
        order=Order.STEP,
        apply=_apply,
        requires=gpu_only("device prefetch overlaps copies to a GPU and this run is on the CPU"),
        recommend=on_gpu(),
        exact=True,
        doctor_rules=("non-blocking",),
        summary="the next batch is already on the GPU when the step starts",
        bench=BenchEntry(("cnn",), {"device_prefetch": True, "pin_memory": True}),
        applies_to=ANY_MODEL,
        tune=by_rule(),
        export=Export(
            unexported="neither Lightning nor Accelerate has a flag for a side-stream copy of the next batch, "
            "and no code line is written for it yet (turbotrain.data.DeviceLoader does it)"
        ),
    )
)
