"""preload: put a dataset that fits into RAM (this process) or /dev/shm (shared by every worker) once."""

from __future__ import annotations

import os
import shutil
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree
from torch.utils.data import DataLoader, Dataset

from .files import FileDataset
from .parquet import ParquetDataset

__all__ = ["preload", "PreloadedDataset"]

_TARGETS = ("memory", "shm")


def _available_bytes(to: str) -> int:
    if to == "shm":
        return shutil.disk_usage("/dev/shm").free
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _nbytes(leaf: Any) -> int:
    if isinstance(leaf, torch.Tensor):
        return leaf.element_size() * leaf.numel()
    if isinstance(leaf, np.ndarray):
        return leaf.nbytes
    return 8


def _as_tensor(leaf: Any) -> torch.Tensor | None:
    if isinstance(leaf, torch.Tensor):
        return leaf
    if isinstance(leaf, np.ndarray) and leaf.dtype != object:
        return torch.from_numpy(leaf)
    if isinstance(leaf, (bool, int, float)):
        return torch.tensor(leaf)
    return None


def _keep_item(item: Any) -> Any:
    return item  # a DataLoader's default collation would turn numpy arrays into tensors behind our back


class PreloadedDataset(Dataset):
    """A map-style dataset whose items are slices of a few stacked tensors (in shared memory for ``"shm"``).

    Numbers in the original items come back as 0-d tensors; the default collation treats both alike.
    """

    def __init__(self, leaves: list[torch.Tensor], spec: Any, to: str):
        self.leaves, self.spec, self.to = leaves, spec, to

    def __len__(self) -> int:
        return int(self.leaves[0].shape[0]) if self.leaves else 0

    def __getitem__(self, index: int) -> Any:
        return pytree.tree_unflatten([leaf[index] for leaf in self.leaves], self.spec)

    def nbytes(self) -> int:
        return sum(_nbytes(leaf) for leaf in self.leaves)

    def __repr__(self) -> str:
        return f"PreloadedDataset({len(self)} items, {self.nbytes() / 1e6:.1f} MB in {self.to})"


class _ListDataset(Dataset):
    def __init__(self, items: list[Any]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]


def _preload_items(dataset: Any, to: str, num_workers: int) -> Dataset:
    n = len(dataset)
    if n == 0:
        raise ValueError("preload: the dataset is empty")
    first = dataset[0]
    estimate = n * sum(_nbytes(leaf) for leaf in pytree.tree_leaves(first))
    available = _available_bytes(to)
    if estimate > 0.9 * available:
        raise MemoryError(
            f"preload(to={to!r}): the dataset needs about {estimate / 1e9:.2f} GB ({n} items like the "
            f"first) but only {available / 1e9:.2f} GB is free there. Preload a subset, or read it "
            "through tt.data.FileDataset(..., cache='/local/disk') instead."
        )
    loader = DataLoader(dataset, batch_size=None, shuffle=False, num_workers=num_workers, collate_fn=_keep_item)
    items = list(loader)
    flat = [pytree.tree_flatten(item) for item in items]
    spec = flat[0][1]
    columns = list(zip(*(leaves for leaves, _ in flat))) if flat[0][0] else []
    stackable = all(s == spec for _, s in flat) and columns
    stacked: list[torch.Tensor] = []
    if stackable:
        for column in columns:
            found = [_as_tensor(leaf) for leaf in column]
            tensors = [t for t in found if t is not None]
            if len(tensors) < len(found) or len({tuple(t.shape) for t in tensors}) != 1:
                stackable = False
                break
            stacked.append(torch.stack(tensors))
    if stackable:
        if to == "shm":
            stacked = [t.share_memory_() for t in stacked]  # workers (fork or spawn) map it, never copy it
        return PreloadedDataset(stacked, spec, to)
    if to == "shm":
        raise TypeError(
            "preload(to='shm') needs items made of tensors, arrays or numbers of one shape per field "
            f"(got {type(first).__name__} items that differ); use to='memory', or a FileDataset with "
            "cache='shm' for raw files"
        )
    return _ListDataset(items)


def preload(dataset: Any, to: str = "memory", *, num_workers: int = 0) -> Any:
    """``dataset`` with everything read once into RAM (``"memory"``) or /dev/shm (``"shm"``).

    A FileDataset or ParquetDataset gets its files cached there (fetched many at once) and keeps
    decoding per item; any other map-style dataset is read item by item (``num_workers`` processes
    help with slow decoding) and stacked into tensors. Raises MemoryError up front when the
    estimate does not fit in what is free.
    """
    if to not in _TARGETS:
        raise ValueError(f"preload(to={to!r}): expected one of {_TARGETS}")
    if isinstance(dataset, FileDataset):
        return dataset.with_cache(to).fill()
    if isinstance(dataset, ParquetDataset):
        return dataset.with_cache(to).fill()
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise TypeError(
            f"preload needs a map-style dataset (with __len__ and __getitem__), got {type(dataset).__name__}"
        )
    return _preload_items(dataset, to, num_workers)
