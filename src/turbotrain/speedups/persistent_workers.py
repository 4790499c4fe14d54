"""Persistent DataLoader workers: no process start-up (and dataset re-pickling) every epoch."""

from __future__ import annotations

from .model_info import ANY_MODEL
from .policy import Export, by_finder
from .registry import BenchEntry, Order, Speedup, loader_setting, register

ENTRY = register(
    Speedup(
        name="persistent_workers",
        field="persistent_workers",
        order=Order.LOADER,
        apply=loader_setting("persistent_workers"),
        exact=True,
        doctor_rules=("persistent-workers",),
        summary="worker processes survive between epochs",
        bench=BenchEntry(("data",), {"persistent_workers": True, "num_workers": 2}),
        applies_to=ANY_MODEL,
        tune=by_finder("num_workers finder (on with workers)"),
        export=Export(dataloader="persistent_workers"),
    )
)
