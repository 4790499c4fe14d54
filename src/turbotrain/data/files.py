"""FileDataset: a map-style dataset over files at any fsspec URL, read through a local cache."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable, Sequence

from torch.utils.data import Dataset, get_worker_info

from . import stats
from .cache import DiskCache, MemoryCache, open_cache
from .fetch import Fetcher, RetryPolicy, expand_urls

__all__ = ["FileDataset"]

log = logging.getLogger("turbotrain")


class FileDataset(Dataset):
    """Item ``i`` is ``decode(bytes of file i)``; the files live wherever fsspec can reach.

    ``urls``: a list of URLs or paths, or one glob (``"s3://bucket/train/*.jpg"``,
    ``"https://host/data/*.bin"`` where the server lists directories). ``cache``: a local directory,
    ``"shm"`` (/dev/shm, shared by all processes), ``"memory"`` (this process's RAM) or None.

    A DataLoader with ``batch_size`` calls ``__getitems__`` with a whole batch of indices, and every
    file of the batch not yet cached is fetched at once, up to ``max_in_flight`` requests in flight
    per process. ``fill()`` fetches the whole dataset that way up front. Later epochs read the cache.
    """

    def __init__(self, urls: str | os.PathLike | Iterable[str], decode: Callable[[bytes], Any] | None = None,
                 cache: Any = None, *, storage_options: dict[str, Any] | None = None, max_in_flight: int = 32,
                 retry: RetryPolicy | None = None):
        self.storage_options = dict(storage_options or {})
        self.urls: list[str] = expand_urls(urls, self.storage_options)
        self.decode = decode
        self.cache = open_cache(cache)
        stats.share_with_workers()
        self.fetcher = Fetcher(self.storage_options, max_in_flight=max_in_flight, retry=retry)
        self._warned_memory = False

    def __len__(self) -> int:
        return len(self.urls)

    def __repr__(self) -> str:
        return f"FileDataset({len(self.urls)} files, cache={self.cache!r})"

    def _decoded(self, data: bytes) -> Any:
        return self.decode(data) if self.decode is not None else data

    def __getitem__(self, index: int) -> Any:
        return self._decoded(self.read_bytes(index))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return [self._decoded(d) for d in self._read_many([self.urls[i] for i in indices])]

    def read_bytes(self, index: int) -> bytes:
        """The raw bytes of file ``index``, from the cache when it is there."""
        return self._read_many([self.urls[index]])[0]

    def _read_many(self, urls: list[str]) -> list[bytes]:
        found: dict[str, bytes] = {}
        if self.cache is not None:
            for url in urls:
                data = self.cache.get(url)
                if data is not None:
                    found[url] = data
        missing = list(dict.fromkeys(u for u in urls if u not in found))
        if missing:
            self._warn_memory_in_worker()
            for url, data in self.fetcher.read_many(missing):
                self._store(url, data)
                found[url] = data
        return [found[u] for u in urls]

    def _store(self, url: str, data: bytes) -> None:
        if self.cache is not None:
            self.cache.put(url, data)

    def _warn_memory_in_worker(self) -> None:
        if isinstance(self.cache, MemoryCache) and not self._warned_memory and get_worker_info() is not None:
            self._warned_memory = True
            log.warning("turbotrain: FileDataset(cache='memory') is filling inside a DataLoader worker; what it "
                        "caches there is lost to the other workers and to the next epoch's workers. Use "
                        "cache='shm' (shared by all processes), call dataset.fill() before iterating, or "
                        "num_workers=0.")

    def fill(self, indices: Iterable[int] | None = None) -> "FileDataset":
        """Fetch every file (or those at ``indices``) not yet cached, many at once; returns self."""
        if self.cache is None:
            raise ValueError("fill() needs a cache: FileDataset(..., cache='memory' | 'shm' | '/local/dir')")
        self.fetcher.fill(self.cache, self.urls if indices is None else [self.urls[i] for i in indices])
        return self

    def cached_fraction(self) -> float:
        """Share of this dataset's files already in the cache (0.0 without a cache)."""
        if self.cache is None or not self.urls:
            return 0.0
        return sum(u in self.cache for u in self.urls) / len(self.urls)

    def with_cache(self, cache: Any) -> "FileDataset":
        """The same files and decoder read through another cache."""
        clone = object.__new__(FileDataset)
        clone.__dict__.update(self.__dict__)
        clone.cache = open_cache(cache)
        clone._warned_memory = False
        return clone

    @property
    def cache_dir(self) -> str | None:
        return str(self.cache.root) if isinstance(self.cache, DiskCache) else None
