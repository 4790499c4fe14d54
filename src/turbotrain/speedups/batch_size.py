"""Batch size: the largest that fits, a multiple of 8 (tensor-core friendly)."""

from __future__ import annotations

from .model_info import ANY_MODEL
from .policy import Export, by_finder
from .registry import BenchEntry, Order, Speedup, loader_setting, register


def round_to_multiple(n: int, multiple: int = 8) -> int:
    """``n`` rounded down to a multiple (never below ``multiple`` itself)."""
    return max(multiple, n // multiple * multiple)


ENTRY = register(
    Speedup(
        name="batch_size",
        field="batch_size",
        order=Order.LOADER,
        apply=loader_setting("batch_size"),
        exact=False,
        doctor_rules=("batch-size-not-multiple-of-8", "small-batch"),
        summary="fewer, larger steps use the hardware's width",
        bench=BenchEntry(("cnn",), {"batch_size": 128}),
        applies_to=ANY_MODEL,
        tune=by_finder("batch-size finder"),
        export=Export(dataloader="batch_size"),
    )
)
