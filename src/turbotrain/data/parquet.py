"""ParquetDataset: record batches of Parquet files (local or remote, cached) streamed through PyArrow.

The unit of work is one row group. Every process (rank x DataLoader worker) takes every
``world_size * num_workers``-th row group of one permutation that all of them compute alike from
``seed`` and the epoch, so each row is read exactly once per epoch with no coordination. Rows are
then shuffled within a buffer of ``shuffle_buffer_rows`` and cut into batches of ``batch_rows``.

Footers are read when the dataset is built (concurrently; through the cache when it holds the
file). Row groups are read one step ahead on a background thread (PyArrow decodes without the
GIL). With a cache, the files this process needs are fetched ahead in the order it reads them,
each as coalesced range requests of ``part_bytes`` (several files and their row groups in flight,
``max_in_flight`` requests at once, at most ``2 * max_in_flight`` parts held in memory), then
joined and written to the cache: epoch 1 reads at the store's speed even when one connection is
slow, and a file larger than a part never waits on a single stream.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import stats
from .cache import DiskCache, open_cache
from .fetch import FetchError, Fetcher, RetryPolicy, expand_urls, scheme_of
from .cache import checked_versions
from .columns import to_torch

__all__ = ["ParquetDataset", "ParquetFileError"]


class ParquetFileError(OSError):
    """A Parquet file (or one of its row groups) could not be read; ``url`` and ``row_group`` say which."""

    def __init__(self, url: str, row_group: int | None, message: str):
        super().__init__(message)
        self.url = url
        self.row_group = row_group


@dataclass(frozen=True)
class _Unit:
    file: int
    row_group: int
    rows: int
    compressed_bytes: int


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None and world_size is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    rank, world_size = int(rank or 0), int(world_size or 1)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    return rank, world_size


class _Batcher:
    """Collects row groups, shuffles within a buffer, and cuts batches of ``batch_rows``."""

    def __init__(self, batch_rows: int, buffer_rows: int, rng: np.random.Generator | None, drop_last: bool):
        self.batch_rows, self.buffer_rows, self.rng, self.drop_last = batch_rows, buffer_rows, rng, drop_last
        self.tables: list = []
        self.rows = 0

    def add(self, table) -> Iterator[Any]:
        self.tables.append(table)
        self.rows += table.num_rows
        if self.rows >= (self.buffer_rows if self.rng is not None else self.batch_rows):
            yield from self._drain(final=False)

    def finish(self) -> Iterator[Any]:
        if self.rows:
            yield from self._drain(final=True)

    def _drain(self, final: bool) -> Iterator[Any]:
        import pyarrow as pa

        table = pa.concat_tables(self.tables) if len(self.tables) > 1 else self.tables[0]
        if self.rng is not None:
            table = table.take(self.rng.permutation(table.num_rows))
        full = table.num_rows // self.batch_rows
        for k in range(full):
            yield table.slice(k * self.batch_rows, self.batch_rows)
        rest = table.slice(full * self.batch_rows)
        if final:
            self.tables, self.rows = [], 0
            if rest.num_rows and not self.drop_last:
                yield rest
        else:
            self.tables, self.rows = ([rest], rest.num_rows) if rest.num_rows else ([], 0)


class _Reader:
    """Opens this process's files (cache, local, or remote ranges) and reads row groups from them.

    With a cache, files are fetched ahead in reading order as parts; a joiner thread writes each file
    to the cache as soon as its parts are in (not when it is read), so a file another process waits
    for is never held up by what this one reads first.
    """

    def __init__(self, ds: "ParquetDataset", files_in_order: list[int]):
        self.ds = ds
        self.files_in_order = files_in_order
        self.next_file = 0  # the next file whose parts are not yet asked for
        self.parts: dict[int, list[Future]] = {}  # asked for, not yet in the cache
        self.joined: dict[int, Future] = {}  # done when the file is in the cache
        self.elsewhere: set[int] = set()  # being fetched by another process sharing the cache
        self.open_files: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._joiner = ThreadPoolExecutor(2, thread_name_prefix="turbotrain-parquet-join")

    def _fetch_ahead(self) -> None:
        """Ask for the parts of the next files, in reading order, while fewer than 2 x max_in_flight are held."""
        ds, cache = self.ds, self.ds.cache
        if cache is None:  # never: parquet_file reads ahead only into a cache
            return
        budget = 2 * ds.fetcher.max_in_flight
        with self._lock:
            while self.next_file < len(self.files_in_order):
                file = self.files_in_order[self.next_file]
                url = ds.urls[file]
                if url in cache:
                    self.next_file += 1
                    continue
                spans = ds.spans(file)
                if self.parts and sum(map(len, self.parts.values())) + len(spans) > budget:
                    return
                if isinstance(cache, DiskCache) and not cache.claim(url):
                    self.elsewhere.add(file)  # another worker or rank fetches it: wait for its entry instead
                    self.next_file += 1
                    continue
                self.parts[file] = [ds.fetcher.submit(url, a, b) for a, b in spans]
                self.joined[file] = self._joiner.submit(self._join, file)
                self.next_file += 1

    def _join(self, file: int) -> None:
        url, cache = self.ds.urls[file], self.ds.cache
        try:
            if cache is not None:  # always: only _fetch_ahead, which needs a cache, submits joins
                cache.put(url, b"".join(f.result() for f in self.parts[file]), self.ds.versions.get(url))
        finally:
            if isinstance(cache, DiskCache):
                cache.release(url)
            with self._lock:
                self.parts.pop(file, None)
            self._fetch_ahead()

    def parquet_file(self, file: int):
        pf = self.open_files.get(file)
        if pf is None:
            cache = self.ds.cache
            if cache is not None:
                self._fetch_ahead()
                url = self.ds.urls[file]
                joined = self.joined.pop(file, None)
                if joined is not None:
                    joined.result()
                elif file in self.elsewhere:
                    self.elsewhere.discard(file)
                    policy = self.ds.fetcher.retry
                    give_up = time.monotonic() + policy.attempts * (policy.timeout_s + policy.max_backoff_s)
                    pause = 0.002
                    # Only a DiskCache claims files (self.elsewhere holds no others). claimed() is False as soon
                    # as the claim's process is gone (killed, say): then this process fetches the file itself.
                    while (
                        isinstance(cache, DiskCache)
                        and cache.claimed(url)
                        and url not in cache
                        and time.monotonic() < give_up
                    ):
                        time.sleep(pause)  # its owner joins the parts and renames the entry into place
                        pause = min(0.02, pause * 1.5)
                    # Entry there, or the owner failed or died: _open fetches it whole (and names any error).
            for old in list(self.open_files)[:-2]:  # keep a few open: units of a file usually come together
                self.open_files.pop(old)
            pf = self.open_files[file] = self.ds._open(file)
        return pf

    def read(self, unit: _Unit):
        url = self.ds.urls[unit.file]
        pf = self.parquet_file(unit.file)
        t0 = time.perf_counter()
        try:
            table = pf.read_row_group(unit.row_group, columns=self.ds.columns)
        except (FetchError, FileNotFoundError):
            raise
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
            raise ParquetFileError(
                url,
                unit.row_group,
                f"{url}: row group {unit.row_group} (of "
                f"{pf.metadata.num_row_groups}) could not be read: {exc}"
                f"{self.ds._where(url)}",
            ) from exc
        stats.record(self.ds._read_scheme(url), unit.compressed_bytes, time.perf_counter() - t0)
        return table

    def close(self) -> None:
        with self._lock:
            self.next_file = len(self.files_in_order)  # ask for nothing more
            for parts in self.parts.values():
                for fut in parts:
                    fut.cancel()  # a joiner then fails on a cancelled part and releases the claim
        self._joiner.shutdown(wait=True)
        self.open_files.clear()


class ParquetDataset(IterableDataset):
    """Batches of rows from Parquet files at any fsspec URL, each row once per epoch.

    ``urls``: a list or a glob. ``columns``: the columns to read (all by default). Each item is one
    batch of ``batch_rows`` rows (the last one of a process may be shorter unless ``drop_last``):
    a dict of column name to tensor (numeric and fixed-size-list columns) or list (anything else),
    or a ``pyarrow.Table`` with ``format="arrow"``. Use it with ``DataLoader(ds, batch_size=None,
    num_workers=...)``. ``shuffle=True`` permutes row groups per epoch and rows within a buffer of
    ``shuffle_buffer_rows``; call ``set_epoch(e)`` each epoch (the Trainer does) for a new order.
    ``rank``/``world_size`` default to torch.distributed's, or the RANK/WORLD_SIZE variables.
    With a cache, files are fetched ahead as range requests of ``part_bytes`` (default
    ``PART_BYTES``, 1 MiB), ``max_in_flight`` at once.
    """

    PART_BYTES = 1 << 20

    def __init__(
        self,
        urls: str | os.PathLike | Iterable[str],
        columns: list[str] | None = None,
        batch_rows: int = 1024,
        *,
        shuffle: bool = False,
        shuffle_buffer_rows: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        cache: Any = None,
        storage_options: dict[str, Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        format: str = "torch",
        transform: Callable[[Any], Any] | None = None,
        read_ahead: int = 2,
        max_in_flight: int = 64,
        retry: RetryPolicy | None = None,
        part_bytes: int | None = None,
    ):
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
        if format not in ("torch", "arrow"):
            raise ValueError(f"format={format!r}: expected 'torch' or 'arrow'")
        self.urls = expand_urls(urls, storage_options)
        self.columns = list(columns) if columns is not None else None
        self.batch_rows = batch_rows
        self.shuffle = shuffle
        self.shuffle_buffer_rows = max(shuffle_buffer_rows or 16 * batch_rows, batch_rows)
        self.seed, self.drop_last, self.format, self.transform = seed, drop_last, format, transform
        self.read_ahead = max(1, read_ahead)
        self.cache = open_cache(cache)
        stats.share_with_workers()
        self.fetcher = Fetcher(storage_options, max_in_flight=max_in_flight, retry=retry)
        self.part_bytes = int(part_bytes or self.PART_BYTES)
        if self.part_bytes < 1:
            raise ValueError(f"part_bytes must be positive, got {part_bytes}")
        self.versions = checked_versions(self.urls, self.fetcher, self.cache)
        self.sizes: dict[int, int] = {}
        self.rank, self.world_size = _rank_world(rank, world_size)
        self._epoch = 0
        self._iterations = 0
        self.units, self.schema = self._plan()
        self.num_rows = sum(u.rows for u in self.units)

    def __repr__(self) -> str:
        return (
            f"ParquetDataset({len(self.urls)} files, {len(self.units)} row groups, {self.num_rows} rows, "
            f"rank {self.rank}/{self.world_size}, cache={self.cache!r})"
        )

    # -- opening files ------------------------------------------------------------------------

    def _cache_file(self, url: str) -> None:
        cache = self.cache
        if cache is not None and url not in cache:  # called with a cache only
            cache.put(url, self.fetcher.read(url), self.versions.get(url))

    def spans(self, file: int) -> list[tuple[int | None, int | None]]:
        """The byte ranges ``file`` is fetched in: parts of ``part_bytes`` (the whole of a file of unknown size)."""
        size = self.sizes.get(file)
        if not size:
            return [(None, None)]
        return [(start, min(start + self.part_bytes, size)) for start in range(0, size, self.part_bytes)]

    def _where(self, url: str) -> str:
        path = self.cache.local_path(url) if self.cache is not None else None
        return (
            (f" (read from the cached copy {path}; if the original is fine, clear the cache with tt.data.clear_cache)")
            if path
            else ""
        )

    def _read_scheme(self, url: str) -> str:
        return stats.CACHE_SCHEME if self.cache is not None and url in self.cache else scheme_of(url)

    def _source(self, file: int, whole: bool = True):
        import pyarrow as pa

        url = self.urls[file]
        if self.cache is not None and (whole or url in self.cache):
            if isinstance(self.cache, DiskCache):
                # local_path checks the entry against its record (a wrong length is dropped): then fetch it.
                path = self.cache.local_path(url)
                if path is None:
                    self._cache_file(url)
                    path = self.cache.local_path(url)
                return path if path is not None else pa.BufferReader(self.fetcher.read(url))
            self._cache_file(url)
            return pa.BufferReader(self.cache.get(url))
        if scheme_of(url) == "file":
            return url
        fs, path = self.fetcher.filesystem(url)
        handle = fs.open(path, "rb")  # ranged reads: only the footer and the row groups asked for
        self.sizes[file] = handle.size
        return handle

    def _open(self, file: int, whole: bool = True):
        """The ParquetFile for ``file``; ``whole=False`` reads just what is asked (ranges) when not cached."""
        import pyarrow.parquet as pq

        url = self.urls[file]
        source = self._source(file, whole)
        try:
            return pq.ParquetFile(source, memory_map=isinstance(source, str), page_checksum_verification=True)
        except (FetchError, FileNotFoundError):
            raise
        except Exception as exc:  # pyarrow's errors say little about which file
            raise ParquetFileError(
                url,
                None,
                f"{url}: not a readable Parquet file: its footer cannot be read "
                f"({exc}). The file is truncated or is not Parquet; rewrite it or leave it out"
                f"{self._where(url)}.",
            ) from exc

    def _plan(self) -> tuple[list[_Unit], Any]:
        def footer(file: int):
            pf = self._open(file, whole=False)  # the footer only: whole files are fetched when read
            md = pf.metadata
            units = [
                _Unit(
                    file,
                    rg,
                    md.row_group(rg).num_rows,
                    sum(md.row_group(rg).column(c).total_compressed_size for c in range(md.row_group(rg).num_columns)),
                )
                for rg in range(md.num_row_groups)
            ]
            return units, pf.schema_arrow

        results = list(self.fetcher.pool().map(footer, range(len(self.urls))))
        for file, url in enumerate(self.urls):
            if file not in self.sizes and scheme_of(url) == "file":
                self.sizes[file] = os.path.getsize(url)
        schema = results[0][1]
        if self.columns is not None:
            missing = [c for c in self.columns if c not in schema.names]
            if missing:
                raise KeyError(f"column(s) {missing} not in {self.urls[0]}; its columns are {schema.names}")
        return [u for units, _ in results for u in units], schema

    # -- iteration ----------------------------------------------------------------------------

    def with_cache(self, cache: Any) -> "ParquetDataset":
        """The same dataset read through another cache."""
        clone = object.__new__(ParquetDataset)
        clone.__dict__.update(self.__dict__)
        clone.cache = open_cache(cache)
        clone.versions = checked_versions(clone.urls, clone.fetcher, clone.cache)
        return clone

    def fill(self) -> "ParquetDataset":
        """Fetch every file not yet cached into the cache, many at once; returns self."""
        if self.cache is None:
            raise ValueError("fill() needs a cache: ParquetDataset(..., cache='memory' | 'shm' | '/local/dir')")
        self.fetcher.fill(self.cache, self.urls, self.versions)
        return self

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order (row-group permutation and row shuffle) from the next iteration on."""
        self._epoch, self._iterations = int(epoch), 0

    def _order(self, epoch: int | None) -> list[int]:
        """The epoch's permutation of all row groups, the same in every process."""
        order = list(range(len(self.units)))
        if self.shuffle:
            np.random.default_rng([self.seed, self._epoch if epoch is None else epoch]).shuffle(order)
        return order

    def assigned_units(self, worker: int = 0, num_workers: int = 1, epoch: int | None = None) -> list[_Unit]:
        """The row groups this rank's ``worker`` of ``num_workers`` reads in ``epoch``."""
        stride = self.world_size * num_workers
        return [self.units[k] for k in self._order(epoch)[self.rank * num_workers + worker :: stride]]

    def fetch_order(self, units: list[_Unit], epoch: int) -> list[int]:
        """The files ``units`` need, in the order the whole epoch first needs them (all processes alike).

        Processes sharing a cache then claim files in one order: the first files each of them needs are
        fetched first, whichever process fetches them.
        """
        needed = {u.file for u in units}
        return [f for f in dict.fromkeys(self.units[k].file for k in self._order(epoch)) if f in needed]

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # Persistent workers never see set_epoch on the main process's copy: count iterations here too.
        epoch = self._epoch + self._iterations
        self._iterations += 1
        units = self.assigned_units(worker, num_workers, epoch)
        rng = np.random.default_rng([self.seed, epoch, self.rank, worker]) if self.shuffle else None
        batcher = _Batcher(self.batch_rows, self.shuffle_buffer_rows, rng, self.drop_last)
        reader = _Reader(self, self.fetch_order(units, epoch))
        pool = ThreadPoolExecutor(1, thread_name_prefix="turbotrain-parquet")
        try:
            ahead: deque[Future] = deque()
            todo = iter(units)
            for unit in todo:
                ahead.append(pool.submit(reader.read, unit))
                if len(ahead) >= self.read_ahead:
                    break
            while ahead:
                table = ahead.popleft().result()
                nxt = next(todo, None)
                if nxt is not None:
                    ahead.append(pool.submit(reader.read, nxt))
                for batch in batcher.add(table):
                    yield self._emit(batch)
            for batch in batcher.finish():
                yield self._emit(batch)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            reader.close()

    def _emit(self, table) -> Any:
        out = to_torch(table) if self.format == "torch" else table
        return self.transform(out) if self.transform is not None else out
