"""Read-ahead: requests kept in flight across batch boundaries, in the order the sampler asks for files.

Without it a batching DataLoader fetches each batch as one burst and waits for its slowest file
before the next burst starts, so the store idles between batches. With it, the loader's batch
sampler is wrapped (:func:`read_ahead`): as the DataLoader pulls batch k, the wrapper pulls
indices further ahead from the user's sampler and hands them to one :class:`ReadAheadStream` in
the main process, which keeps ``max_in_flight`` reads outstanding, writes each file to the cache
from the fetch thread, and starts the next read as soon as one ends. A batch then waits only for
its own files.

With DataLoader workers the stream still runs once, in the main process (the process that
iterates the sampler), and fills a cache every process sees (a directory or ``"shm"``); a worker
asked for a file the stream has claimed waits for that file (a shared state per index says
claimed, done or failed) instead of fetching it a second time. Without such a cache, workers
fetch their own batches as before.

Memory stays bounded: the stream holds indices for a window ahead, and bytes only for files
fetched but not yet taken when the main process itself consumes them (``num_workers=0``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Iterable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Sampler

from .cache import DiskCache
from .loader import batch_sampler_of, rebuild_loader

__all__ = ["read_ahead", "ReadAheadBatches", "ReadAheadStream"]

log = logging.getLogger("turbotrain")

NONE, CLAIMED, DONE, FAILED = 0, 1, 2, 3
_POLL_S = 0.002


class ReadAheadStream:
    """Up to ``dataset.fetcher.max_in_flight`` reads outstanding, in the order indices are fed."""

    def __init__(self, dataset: Any, keep_bytes: bool):
        self.ds = dataset
        self.keep_bytes = keep_bytes  # this process consumes the files (no workers): hold them until taken
        self.in_flight = dataset.fetcher.max_in_flight
        self.window = 2 * self.in_flight  # files held (running + fetched, not taken) with keep_bytes
        self.pid = os.getpid()
        self._lock = threading.RLock()  # a future that is already done runs its callback inside _pump
        self._planned: deque[int] = deque()
        self._running: dict[int, Future] = {}
        self._ready: dict[int, bytes] = {}
        self._errors: dict[int, BaseException] = {}
        self._closed = False

    def feed(self, indices: Iterable[int]) -> None:
        with self._lock:
            self._planned.extend(indices)
            self._pump()

    def _pump(self) -> None:
        ds, states = self.ds, self.ds.read_states
        while (self._planned and not self._closed and len(self._running) < self.in_flight
               and (not self.keep_bytes or len(self._running) + len(self._ready) < self.window)):
            i = self._planned.popleft()
            if i in self._running or i in self._ready:
                continue
            if ds.cache is not None and ds.urls[i] in ds.cache:
                states[i] = DONE
                continue
            states[i] = CLAIMED
            fut = ds.fetcher.pool().submit(ds.fetch_into_cache, ds.urls[i])
            self._running[i] = fut
            fut.add_done_callback(lambda f, i=i: self._done(i, f))

    def _done(self, i: int, fut: Future) -> None:
        with self._lock:
            self._running.pop(i, None)
            states = self.ds.read_states
            if fut.cancelled():
                states[i] = NONE
            elif fut.exception() is not None:
                states[i] = FAILED
                if self.keep_bytes:
                    self._errors[i] = fut.exception()
            else:
                states[i] = DONE
                if self.keep_bytes:
                    self._ready[i] = fut.result()
            self._pump()

    def take(self, indices: Sequence[int]) -> dict[int, bytes]:
        """The bytes of those ``indices`` this stream read or is reading (waiting for its own files only).

        Files it never claimed, or failed to read, are left out: the caller reads them itself, which
        raises the error with the URL in this thread.
        """
        out: dict[int, bytes] = {}
        waits: list[tuple[int, Future]] = []
        with self._lock:
            for i in indices:
                if i in self._ready:
                    out[i] = self._ready.pop(i)
                elif i in self._running:
                    waits.append((i, self._running[i]))
                else:
                    self._errors.pop(i, None)
            self._pump()
        for i, fut in waits:
            try:
                out[i] = fut.result()
            except Exception:  # noqa: BLE001 - re-read by the caller, which names the URL
                pass
        if waits:
            with self._lock:
                for i, _ in waits:
                    self._ready.pop(i, None)
                    self._errors.pop(i, None)
                self._pump()
        return out

    def close(self) -> None:
        """Stop: reads not started are cancelled (their indices go back to unclaimed), held bytes dropped."""
        with self._lock:
            self._closed = True
            self._planned.clear()
            for fut in list(self._running.values()):
                fut.cancel()
            self._ready.clear()
            self._errors.clear()


def wait_for_claimed(dataset: Any, indices: Sequence[int], patience_s: float) -> None:
    """In a DataLoader worker: wait until the main process's stream is done with the claimed ``indices``."""
    states = dataset.read_states
    deadline = time.monotonic() + patience_s
    pending = [i for i in indices if states[i] == CLAIMED]
    while pending and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        pending = [i for i in pending if states[i] == CLAIMED]


class ReadAheadBatches(Sampler):
    """A batch sampler that pulls the wrapped one's index lists ahead and feeds them to a read-ahead stream.

    The first pull of an epoch happens when the DataLoader asks for the first batch, as it would
    without this wrapper (samplers draw their random seed then); later pulls only read ahead in
    an order already drawn.
    """

    def __init__(self, batches: Iterable[list[int]], dataset: Any, keep_bytes: bool):
        self.batches = batches
        self.dataset = dataset
        self.keep_bytes = keep_bytes
        self.ahead = 4 * dataset.fetcher.max_in_flight  # indices pulled beyond the DataLoader's position

    @property
    def sampler(self) -> Any:
        return getattr(self.batches, "sampler", None)

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[int]]:
        stream = self.dataset.start_read_ahead(self.keep_bytes)
        it = iter(self.batches)
        pending: deque[list[int]] = deque()
        pulled, exhausted, finished = 0, False, False
        try:
            while True:
                while not exhausted and pulled < self.ahead:
                    batch = next(it, None)
                    if batch is None:
                        exhausted = True
                        break
                    pending.append(batch)
                    pulled += len(batch)
                    stream.feed(batch)
                if not pending:
                    finished = True
                    return
                batch = pending.popleft()
                pulled -= len(batch)
                yield batch
        finally:
            if not finished:  # abandoned mid-epoch: nobody will ask for what is still planned
                stream.close()


def read_ahead(loader: Any) -> Any:
    """``loader`` rebuilt so its FileDataset's files are fetched ahead, in its sampler's order.

    Returns the loader unchanged when there is nothing to read ahead: not a DataLoader, not over a
    :class:`~turbotrain.data.FileDataset`, no batch sampler, already reading ahead, or workers
    without a cache all processes share (a directory or ``"shm"``; then each worker fetches its own
    batches, many at once).
    """
    from .files import FileDataset

    if not isinstance(loader, DataLoader) or not isinstance(loader.dataset, FileDataset):
        return loader
    inner = batch_sampler_of(loader)
    if inner is None or isinstance(inner, ReadAheadBatches):
        return loader
    ds = loader.dataset
    if loader.num_workers > 0 and not isinstance(ds.cache, DiskCache):
        log.info("turbotrain: no read-ahead for %r with %d DataLoader workers: it needs a cache every process "
                 "sees (cache='/local/dir' or 'shm'); each worker fetches its own batches instead",
                 ds, loader.num_workers)
        return loader
    ds.enable_read_ahead()
    return rebuild_loader(loader, batch_sampler=ReadAheadBatches(inner, ds, keep_bytes=loader.num_workers == 0))


def shared_states(n: int) -> torch.Tensor:
    """One byte per index in shared memory, so forked or spawned workers see the main process's writes."""
    return torch.zeros(n, dtype=torch.uint8).share_memory_()
