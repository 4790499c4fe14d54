"""Persistent DataLoader workers: no process start-up (and dataset re-pickling) every epoch."""

from __future__ import annotations

from .registry import BenchEntry, Order, Speedup, register


def _apply(rt) -> None:
    rt.loader_overrides["persistent_workers"] = rt.plan.persistent_workers


ENTRY = register(Speedup(
    name="persistent_workers", field="persistent_workers", order=Order.LOADER, apply=_apply, exact=True,
    doctor_rules=("persistent-workers",),
    summary="worker processes survive between epochs",
    bench=BenchEntry(("data",), {"persistent_workers": True, "num_workers": 2}),
))
