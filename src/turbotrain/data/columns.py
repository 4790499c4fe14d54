"""Arrow tables to tensors: a batch's numeric columns as views of one buffer.

Why one buffer: a DataLoader worker sends every tensor storage of a batch to the main process
through shared memory, and each storage costs a file descriptor passed over a fresh, authenticated
connection to the worker's resource sharer (``torch.multiprocessing.reductions.reduce_storage``,
``multiprocessing.resource_sharer``), about 0.25 ms of the main process's CPU per storage. Nine
columns were nine storages, which capped 2 workers below what one process reads. Views of one
storage are sent as one. Each column is copied once either way (Arrow's own memory is read-only and
torch wants to own it), so the packing costs nothing in a single process.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

__all__ = ["to_torch", "ALIGN"]

ALIGN = 64  # blocks start at offsets that are a multiple of any element size


@functools.lru_cache(maxsize=None)
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def _values(name: str, column) -> np.ndarray | list:
    """``column`` as a numpy array (possibly a read-only view of Arrow memory), or a list when not numeric."""
    import pyarrow as pa

    arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    kind = arr.type
    numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    fixed_list = pa.types.is_fixed_size_list(kind) and (
        pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type)
    )
    if not (numeric or fixed_list):
        return arr.to_pylist()
    if arr.null_count:
        raise ValueError(
            f"column {name!r} has {arr.null_count} null value(s), which a tensor cannot hold: fill "
            "them when writing the data, or use ParquetDataset(..., format='arrow')"
        )
    if fixed_list:
        return arr.flatten().to_numpy(zero_copy_only=False).reshape(len(arr), kind.list_size)
    return arr.to_numpy(zero_copy_only=False)


def to_torch(table) -> dict[str, Any]:
    """Column name to tensor (numeric and fixed-size-list columns, all views of one storage) or list."""
    values = {name: _values(name, col) for name, col in zip(table.column_names, table.columns)}
    # Columns of one dtype and shape are rows of one block: a few torch calls per batch, not a few per
    # column (each costs microseconds, as much as copying the column).
    groups: dict[tuple, list[str]] = {}
    for name, v in values.items():
        if isinstance(v, np.ndarray):
            groups.setdefault((v.dtype, v.shape), []).append(name)
    sizes = [len(names) * values[names[0]].nbytes for names in groups.values()]  # type: ignore[union-attr]  # arrays only
    raw = np.empty(sum(-(-size // ALIGN) * ALIGN for size in sizes), dtype=np.uint8)  # cheaper than torch.empty
    storage = torch.from_numpy(raw).untyped_storage()
    out: dict[str, Any] = {name: v for name, v in values.items() if not isinstance(v, np.ndarray)}
    start = 0
    for ((dtype, shape), names), size in zip(groups.items(), sizes):
        block = raw[start : start + size].view(dtype).reshape(len(names), *shape)
        for row, name in zip(block, names):
            np.copyto(row, values[name])
        # Torch views of the one storage, not from_numpy (which would give each block a storage of its own).
        tensors = (
            torch.empty(0, dtype=_torch_dtype(dtype))
            .set_(  # type: ignore[call-overload]  # contiguous: no stride
                storage, start // dtype.itemsize, (len(names), *shape)
            )
            .unbind(0)
        )
        out.update(zip(names, tensors))
        start += -(-size // ALIGN) * ALIGN
    return {name: out[name] for name in values}  # the table's column order
