"""Pinned (page-locked) host memory for batches: faster and asynchronous host-to-device copies."""

from __future__ import annotations

from .model_info import ANY_MODEL
from .policy import Export, by_finder
from .registry import BenchEntry, Order, Speedup, gpu_only, loader_setting, on_gpu, register

_needs_gpu = gpu_only("pinned memory only speeds up copies to a GPU and this run is on the CPU")

ENTRY = register(
    Speedup(
        name="pin_memory",
        field="pin_memory",
        order=Order.LOADER,
        apply=loader_setting("pin_memory"),
        # Asking for pin_memory=False is always possible; only True needs a GPU.
        requires=lambda hw, plan: _needs_gpu(hw, plan) if plan.pin_memory else None,
        recommend=on_gpu(),
        exact=True,
        doctor_rules=("pin-memory",),
        summary="DMA copies from page-locked memory, no staging copy",
        bench=BenchEntry(("cnn",), {"pin_memory": True}),
        applies_to=ANY_MODEL,
        tune=by_finder("num_workers finder (on for a GPU)"),
        export=Export(dataloader="pin_memory"),
    )
)
