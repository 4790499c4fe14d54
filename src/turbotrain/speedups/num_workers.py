"""DataLoader worker processes: decode and collate batches in parallel with training."""

from __future__ import annotations

from .model_info import ANY_MODEL
from .policy import Export, by_finder
from .registry import BenchEntry, Order, Speedup, loader_setting, register

# No rule picks a worker count without seeing the data: the tuner's num_workers finder
# measures it (workers only pay off when loading, not compute, is the bottleneck).
ENTRY = register(
    Speedup(
        name="num_workers",
        field="num_workers",
        order=Order.LOADER,
        apply=loader_setting("num_workers"),
        exact=True,
        doctor_rules=("num-workers",),
        summary="batches are prepared in parallel processes while the model trains",
        bench=BenchEntry(("data",), {"num_workers": 2}),
        applies_to=ANY_MODEL,
        tune=by_finder("num_workers finder"),
        export=Export(dataloader="num_workers"),
    )
)
