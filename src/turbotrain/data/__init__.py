"""Data: remote files at local speed (fsspec + a local cache), Parquet streaming, preloading, device prefetch.

    import turbotrain as tt
    ds = tt.data.FileDataset("s3://bucket/train/*.jpg", decode=decode_jpeg, cache="/nvme/cache")
    rows = tt.data.ParquetDataset("https://host/data/part-*.parquet", columns=["x", "y"], batch_rows=4096)
    small = tt.data.preload(ds, to="shm")
    loader = tt.data.read_ahead(DataLoader(ds, batch_size=64, shuffle=True, num_workers=2))

``pipeline`` composes a training loader in the order data flows (source -> read-ahead -> sampler ->
DataLoader -> device); its stages live in ``readahead``, ``loader`` (rebuilding DataLoaders),
``transfer`` (moving batches) and ``prefetch`` (``DeviceLoader``).
"""

from __future__ import annotations

from . import loader, pipeline, prefetch, stats, transfer
from .cache import CacheFullError, clear_cache
from .fetch import FetchError, RetryPolicy
from .files import FileDataset
from .parquet import ParquetDataset, ParquetFileError
from .prefetch import DeviceLoader
from .preloading import preload
from .pipeline import read_ahead

__all__ = [
    "FileDataset",
    "ParquetDataset",
    "preload",
    "read_ahead",
    "DeviceLoader",
    "RetryPolicy",
    "FetchError",
    "CacheFullError",
    "ParquetFileError",
    "clear_cache",
    "stats",
    "loader",
    "transfer",
    "prefetch",
    "pipeline",
]
