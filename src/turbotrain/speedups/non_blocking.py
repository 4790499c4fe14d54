"""Non-blocking host-to-device copies: the host queues the copy and goes on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .model_info import ANY_MODEL
from .policy import Export, by_rule
from .registry import BenchEntry, Order, Speedup, gpu_only, on_gpu, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime import Runtime


def _apply(rt: Runtime) -> None:
    rt.non_blocking = True


ENTRY = register(
    Speedup(
        name="non_blocking",
        field="non_blocking",
        order=Order.STEP,
        apply=_apply,
        requires=gpu_only("there is no host-to-device copy when training on the CPU"),
        recommend=on_gpu(),
        exact=True,
        doctor_rules=("non-blocking",),
        summary="copies overlap with work already queued on the GPU",
        bench=BenchEntry(("cnn",), {"non_blocking": True, "pin_memory": True}),
        applies_to=ANY_MODEL,
        tune=by_rule(),
        export=Export(
            unexported="Lightning already copies CUDA batches with non_blocking=True; Accelerate's "
            "DataLoaderConfiguration(non_blocking=True) is not written yet"
        ),
    )
)
