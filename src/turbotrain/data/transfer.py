"""Moving a batch (tensors nested in tuples, lists, dicts, dataclasses) to the device."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

__all__ = ["move_batch", "tensors_in", "batch_size_of", "resize_batch"]


def _move_tensor(
    t: torch.Tensor, device: torch.device, non_blocking: bool, channels_last: bool, float_dtype: torch.dtype | None
) -> torch.Tensor:
    dtype = float_dtype if float_dtype is not None and t.is_floating_point() else None
    t = t.to(device, dtype=dtype, non_blocking=non_blocking)
    if channels_last and t.dim() == 4 and t.is_floating_point():
        t = t.contiguous(memory_format=torch.channels_last)
    return t


def move_batch(
    batch: Any,
    device: torch.device,
    *,
    non_blocking: bool = False,
    channels_last: bool = False,
    float_dtype: torch.dtype | None = None,
) -> Any:
    """``batch`` with every tensor on ``device``.

    ``non_blocking`` only overlaps with compute when the source is pinned memory;
    ``channels_last`` converts 4D floating tensors (images) to NHWC; ``float_dtype`` casts
    floating tensors (bf16-true training), leaving integer targets alone.
    """
    if isinstance(batch, torch.Tensor):
        return _move_tensor(batch, device, non_blocking, channels_last, float_dtype)
    if isinstance(batch, (list, tuple)):
        moved = [
            move_batch(b, device, non_blocking=non_blocking, channels_last=channels_last, float_dtype=float_dtype)
            for b in batch
        ]
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
            return type(batch)(*moved)
        return type(batch)(moved) if isinstance(batch, tuple) else moved
    if isinstance(batch, dict):
        return type(batch)(
            (k, move_batch(v, device, non_blocking=non_blocking, channels_last=channels_last, float_dtype=float_dtype))
            for k, v in batch.items()
        )
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(
            batch,
            **{
                f.name: move_batch(
                    getattr(batch, f.name),
                    device,
                    non_blocking=non_blocking,
                    channels_last=channels_last,
                    float_dtype=float_dtype,
                )
                for f in dataclasses.fields(batch)
                if f.init
            },
        )
    return batch


def tensors_in(batch: Any) -> list[torch.Tensor]:
    """Every tensor inside a (nested) batch."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, (list, tuple)):
        return [t for b in batch for t in tensors_in(b)]
    if isinstance(batch, dict):
        return [t for b in batch.values() for t in tensors_in(b)]
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return [t for f in dataclasses.fields(batch) for t in tensors_in(getattr(batch, f.name))]
    return []


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor (1 when there is none)."""
    if type(batch) in (tuple, list) and batch and type(batch[0]) is torch.Tensor and batch[0].dim():
        return batch[0].shape[0]  # the common case, kept cheap: once per micro-batch (len() costs 4x)
    while isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    if isinstance(batch, dict) and batch:
        return batch_size_of(next(iter(batch.values())))
    return int(batch.shape[0]) if isinstance(batch, torch.Tensor) and batch.dim() else 1


def resize_batch(batch: Any, size: int, rows: int | None = None, dim: int = 0) -> Any:
    """``batch`` with every tensor whose dimension ``dim`` is the batch (``rows``, by default the
    batch's size) tiled (or cut) to ``size`` rows; other values pass through. ``dim=1`` is the
    ``[seq, batch, ...]`` layout of an RNN without ``batch_first`` (its hidden state too)."""
    rows = batch_size_of(batch) if rows is None else rows

    def fit(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.dim() > dim and t.shape[dim] == rows:
            reps = math.ceil(size / rows)
            tiled = t.repeat(*[reps if d == dim else 1 for d in range(t.dim())]) if reps > 1 else t
            return tiled.narrow(dim, 0, size)
        if isinstance(t, (list, tuple)):
            items = [fit(x) for x in t]
            return type(t)(*items) if hasattr(t, "_fields") else type(t)(items)
        if isinstance(t, dict):
            return type(t)((k, fit(v)) for k, v in t.items())
        return t

    return fit(batch)
