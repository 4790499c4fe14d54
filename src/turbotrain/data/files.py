"""FileDataset: a map-style dataset over files at any fsspec URL, read through a local cache."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable, Sequence

from torch.utils.data import Dataset, get_worker_info

from . import readahead, stats
from .cache import DiskCache, MemoryCache, checked_versions, open_cache
from .fetch import Fetcher, RetryPolicy, expand_urls

__all__ = ["FileDataset"]

log = logging.getLogger("turbotrain")


class FileDataset(Dataset):
    """Item ``i`` is ``decode(bytes of file i)``; the files live wherever fsspec can reach.

    ``urls``: a list of URLs or paths, or one glob (``"s3://bucket/train/*.jpg"``,
    ``"https://host/data/*.bin"`` where the server lists directories). ``cache``: a local directory,
    ``"shm"`` (/dev/shm, shared by all processes), ``"memory"`` (this process's RAM) or None.

    ``max_in_flight`` requests are kept outstanding: by the read-ahead stream when the loader reads
    ahead (``tt.data.read_ahead(loader)``; the Trainer and ``tt.setup`` do it), which follows the
    sampler's order across batch boundaries, else per batch (``__getitems__`` fetches a batch's
    missing files at once). Size it as target files/s x the store's seconds per request (64 serves
    a 50 ms store at 1,280 files/s). ``fill()`` fetches the whole dataset up front.

    A directory (or ``"shm"``) cache records each entry's version (ETag, or size and modification
    time) from one listing per directory, and a later run re-lists and drops the entries whose
    file changed, so a persistent cache never serves stale bytes.
    """

    def __init__(
        self,
        urls: str | os.PathLike | Iterable[str],
        decode: Callable[[bytes], Any] | None = None,
        cache: Any = None,
        *,
        storage_options: dict[str, Any] | None = None,
        max_in_flight: int = 64,
        retry: RetryPolicy | None = None,
    ):
        self.storage_options = dict(storage_options or {})
        self.urls: list[str] = expand_urls(urls, self.storage_options)
        self.decode = decode
        self.cache = open_cache(cache)
        stats.share_with_workers()
        self.fetcher = Fetcher(self.storage_options, max_in_flight=max_in_flight, retry=retry)
        self._warned_memory = False
        self.plan: readahead.SharedPlan | None = None
        self._stream: readahead.ReadAheadStream | None = None
        self._pump: readahead.WorkerPump | None = None
        self._writer: readahead.CacheWriter | None = None
        self.versions: dict[str, Any] = checked_versions(self.urls, self.fetcher, self.cache)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_stream"], state["_pump"], state["_writer"] = None, None, None  # each belongs to its process
        return state

    # -- read-ahead ---------------------------------------------------------------------------

    def enable_read_ahead(self) -> None:
        """Create the plan and per-index states the read-ahead shares with DataLoader workers."""
        if self.plan is None:
            self.plan = readahead.SharedPlan(len(self.urls))

    def start_read_ahead(self) -> readahead.ReadAheadStream:
        """A new read-ahead stream in this process (the previous one keeps finishing what it started)."""
        self.enable_read_ahead()
        self._stream = readahead.ReadAheadStream(self)
        return self._stream

    def cache_writer(self) -> readahead.CacheWriter:
        """This process's cache writer (threads of its own: made again in a new process)."""
        if self._writer is None or self._writer.pid != os.getpid():
            self._writer = readahead.CacheWriter(self)
        return self._writer

    def __len__(self) -> int:
        return len(self.urls)

    def __repr__(self) -> str:
        return f"FileDataset({len(self.urls)} files, cache={self.cache!r})"

    def _decoded(self, data: bytes) -> Any:
        return self.decode(data) if self.decode is not None else data

    def __getitem__(self, index: int) -> Any:
        return self._decoded(self.read_bytes(index))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return [self._decoded(d) for d in self._read_many(list(indices))]

    def read_bytes(self, index: int) -> bytes:
        """The raw bytes of file ``index``, from the cache when it is there."""
        return self._read_many([index])[0]

    def _read_many(self, indices: list[int]) -> list[bytes]:
        urls = [self.urls[i] for i in indices]
        found: dict[str, bytes] = {}
        stream = self._stream
        if stream is not None and stream.pid == os.getpid():
            found.update((self.urls[i], data) for i, data in stream.take(indices).items())
        elif self.plan is not None and isinstance(self.cache, DiskCache) and (info := get_worker_info()) is not None:
            # A DataLoader worker: the workers fetch the plan the main process writes; wait for our files.
            if self._pump is None or self._pump.pid != os.getpid():
                self._pump = readahead.WorkerPump(self, info.id, info.num_workers)
            policy = self.fetcher.retry
            patience = policy.attempts * (policy.timeout_s + policy.max_backoff_s)
            found.update((self.urls[i], data) for i, data in readahead.read_in_worker(self, indices, patience).items())
        writer = self._writer
        if writer is not None and writer.pid == os.getpid():
            writer.check()  # a read-ahead write that failed (a full disk) is raised here, in the loop's thread
        if self.cache is not None:
            for url in urls:
                if url not in found:
                    data = self.cache.get(url)
                    if data is not None:
                        found[url] = data
        missing = list(dict.fromkeys(u for u in urls if u not in found))
        if missing:
            self._warn_memory_in_worker()
            for url, data in self.fetcher.read_many(missing):
                self.store(url, data)
                found[url] = data
        return [found[u] for u in urls]

    def store(self, url: str, data: bytes) -> None:
        """Keep ``data`` read from ``url`` in the cache (with the version it was read at)."""
        if self.cache is not None:
            self.cache.put(url, data, self.versions.get(url))

    def _warn_memory_in_worker(self) -> None:
        if isinstance(self.cache, MemoryCache) and not self._warned_memory and get_worker_info() is not None:
            self._warned_memory = True
            log.warning(
                "turbotrain: FileDataset(cache='memory') is filling inside a DataLoader worker; what it "
                "caches there is lost to the other workers and to the next epoch's workers. Use "
                "cache='shm' (shared by all processes), call dataset.fill() before iterating, or "
                "num_workers=0."
            )

    def fill(self, indices: Iterable[int] | None = None) -> "FileDataset":
        """Fetch every file (or those at ``indices``) not yet cached, many at once; returns self."""
        if self.cache is None:
            raise ValueError("fill() needs a cache: FileDataset(..., cache='memory' | 'shm' | '/local/dir')")
        self.fetcher.fill(self.cache, self.urls if indices is None else [self.urls[i] for i in indices], self.versions)
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
        clone._stream, clone._pump, clone._writer, clone.plan = None, None, None, None
        clone.versions = checked_versions(clone.urls, clone.fetcher, clone.cache)
        return clone

    @property
    def cache_dir(self) -> str | None:
        return str(self.cache.root) if isinstance(self.cache, DiskCache) else None
