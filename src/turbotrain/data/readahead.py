"""Read-ahead: requests kept in flight across batch boundaries, in the order the sampler asks for files.

Without it a batching DataLoader fetches each batch as one burst and waits for its slowest file
before the next burst starts, so the store idles between batches. With it, the loader's batch
sampler is wrapped (:func:`turbotrain.data.pipeline.read_ahead`): as the DataLoader pulls batch k, the wrapper pulls
indices further ahead from the user's sampler and hands them to one :class:`ReadAheadStream` in
the main process, which keeps ``max_in_flight`` reads outstanding, hands each file to the cache's
writer threads while holding its bytes for the batch (no read-back), and starts the next read as
soon as one ends. A batch then waits only for its own files.

With DataLoader workers there is still one stream, in one order, but the fetching is spread over
the worker processes: the main process (which iterates the sampler) writes the epoch's order into
a shared plan, and worker ``w`` of ``W`` fetches plan positions ``w, w+W, w+2W, ...`` with
``ceil(max_in_flight / W)`` requests in flight, into a cache every process sees (a directory or
``"shm"``). A shared state per index (claimed, done, failed) keeps a file from being fetched twice:
a worker whose batch holds a file another worker is reading waits for that file only. Without
such a cache, workers fetch their own batches as before.

Memory stays bounded: the plan is one integer per file, and bytes are held only for files fetched
but not yet taken when the main process itself consumes them (``num_workers=0``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch.utils.data import Sampler

from .cache import DiskCache

__all__ = ["ReadAheadBatches", "ReadAheadStream"]

log = logging.getLogger("turbotrain")

NONE, CLAIMED, DONE, FAILED = 0, 1, 2, 3
# Polls are for what another process does (its plan, its workers' files); waits in this process are
# woken by the reads themselves. Short enough not to matter next to a request, long enough that the
# polling threads do not take the GIL from the ones doing the work.
_PUMP_IDLE_S = 0.02
_WAIT_POLL_S = (0.001, 0.01)
# Writing a cache entry is CPU work in the kernel, not a wait for the disk (the bytes go to the page
# cache; creating the file's inode is most of it, 0.1 to 0.3 ms on ext4): more writer threads than
# this only contend for the filesystem's locks and the GIL, and took requests' CPU on a 2-core machine.
WRITE_THREADS = 2


class CacheWriter:
    """Cache writes on threads of their own, so a slow disk never holds one of the request slots.

    A file counts as in flight while its request runs; once its bytes are here, writing them is
    this writer's job, and ``pending`` (bounded by the callers) says how many wait for the disk.
    A write that fails (a full disk: :class:`~turbotrain.data.CacheFullError`) is kept in ``error``
    and raised by :meth:`check`, which the dataset calls on each batch and the stream at the epoch's
    end, as a write in the caller's own thread would have raised it.
    """

    def __init__(self, dataset: Any, threads: int = WRITE_THREADS):
        self.ds = dataset
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="turbotrain-cache-write")
        self.pending = 0
        self.pid = os.getpid()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._jobs: set[Future] = set()

    def write(self, url: str, data: bytes, then: Callable[[bool], None]) -> None:
        """Store ``url`` in the dataset's cache, then call ``then(stored)``."""
        with self._lock:
            self.pending += 1

        def job() -> None:
            stored = False
            try:
                if self.error is None:  # after a failure (a full disk) the next writes would fail alike
                    self.ds.store(url, data)
                    stored = True
            except Exception as exc:  # noqa: BLE001 - kept, and raised in the training loop's thread by check()
                with self._lock:
                    if self.error is None:
                        self.error = exc
            finally:
                with self._lock:
                    self.pending -= 1
            then(stored)

        fut = self.pool.submit(job)
        with self._lock:
            self._jobs.add(fut)
        fut.add_done_callback(self._forget)

    def _forget(self, fut: Future) -> None:
        with self._lock:
            self._jobs.discard(fut)

    def check(self) -> None:
        """Raise the first write that failed since the last check (writes go on: space may have been freed)."""
        with self._lock:
            error, self.error = self.error, None
        if error is not None:
            raise error

    def flush(self) -> None:
        """Wait for the writes submitted so far, then raise the first that failed."""
        with self._lock:
            jobs = list(self._jobs)
        wait(jobs)
        self.check()


class ReadAheadStream:
    """Up to ``dataset.fetcher.max_in_flight`` reads outstanding, in the order indices are fed.

    The main process's stream when it consumes the files itself (``num_workers=0``): it holds the
    bytes of files read ahead until their batch takes them, at most ``window`` files.
    """

    def __init__(self, dataset: Any):
        self.ds = dataset
        self.in_flight = dataset.fetcher.max_in_flight
        self.window = 2 * self.in_flight
        self.pid = os.getpid()
        self._writer = dataset.cache_writer() if isinstance(dataset.cache, DiskCache) else None
        self._lock = threading.RLock()  # a future that is already done runs its callback inside _pump
        self._planned: deque[int] = deque()
        self._running: dict[int, Future] = {}
        self._ready: dict[int, bytes] = {}
        self._closed = False

    def feed(self, indices: Iterable[int]) -> None:
        ds = self.ds
        if ds.cache is not None:
            # What the cache holds is looked up here, on the sampler's thread and outside the lock, not
            # when a read starts: _pump also runs on the event loop's thread, where a stat per file
            # (slow while the writers create entries in the same directories) delays every response.
            indices = [i for i in indices if ds.urls[i] not in ds.cache]
        with self._lock:
            self._planned.extend(indices)
            self._pump()

    def _room(self) -> bool:
        writes = self._writer.pending if self._writer is not None else 0
        return (
            len(self._running) < self.in_flight
            and len(self._running) + len(self._ready) + writes < self.window + self.in_flight
        )

    def _pump(self) -> None:
        ds = self.ds
        while self._planned and not self._closed and self._room():
            i = self._planned.popleft()
            if i in self._running or i in self._ready:
                continue
            fut = ds.fetcher.submit(ds.urls[i])
            self._running[i] = fut
            fut.add_done_callback(lambda f, i=i: self._done(i, f))

    def _done(self, i: int, fut: Future) -> None:
        with self._lock:
            self._running.pop(i, None)
            if not self._closed and not fut.cancelled() and fut.exception() is None:
                data = fut.result()
                self._ready[i] = data
                url = self.ds.urls[i]
                if self._writer is not None:
                    self._writer.write(url, data, lambda stored: self.feed(()))
                elif self.ds.cache is not None:
                    self.ds.store(url, data)
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
        for i, fut in waits:
            try:
                out[i] = fut.result()
            except Exception:  # noqa: BLE001 - re-read by the caller, which names the URL
                pass
        with self._lock:
            for i, _ in waits:
                self._ready.pop(i, None)
            self._pump()
        return out

    def finish(self) -> None:
        """The epoch's files were all taken: wait until the last of them are in the cache, so that a run
        that ends here leaves every file it read cached (the writes run on threads of their own)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Stop: reads not started are cancelled, held bytes dropped."""
        with self._lock:
            self._closed = True
            self._planned.clear()
            for fut in list(self._running.values()):
                fut.cancel()
            self._ready.clear()


class SharedPlan:
    """The epoch's order, written by the main process and read by the workers' pumps (shared memory).

    ``control`` holds [generation, planned]: a new epoch bumps the generation and restarts the plan.
    """

    def __init__(self, n: int):
        self.n = n
        self.states = torch.zeros(n, dtype=torch.uint8).share_memory_()
        self.order = torch.zeros(max(n, 1), dtype=torch.int64).share_memory_()
        self.control = torch.zeros(2, dtype=torch.int64).share_memory_()
        self._views: tuple | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_views"], state["_pid"] = None, -1
        return state

    def views(self) -> tuple[Any, Any, Any]:
        """(states, order, control) as numpy arrays over the shared memory."""
        if self._views is None or self._pid != os.getpid():
            self._views = (self.states.numpy(), self.order.numpy(), self.control.numpy())
            self._pid = os.getpid()
        return self._views

    def restart(self) -> None:
        _, _, control = self.views()
        control[1] = 0
        control[0] += 1

    def extend(self, indices: Sequence[int]) -> None:
        _, order, control = self.views()
        start = int(control[1])
        # A sampler drawing more than the dataset: the rest is read per batch.
        take = list(indices)[: max(0, self.n - start)]
        if take:
            order[start : start + len(take)] = take
            control[1] = start + len(take)


class WorkerPump:
    """In DataLoader worker ``worker`` of ``workers``: fetch this worker's share of the plan, in order."""

    def __init__(self, dataset: Any, worker: int, workers: int):
        self.ds, self.worker, self.workers = dataset, worker, workers
        self.quota = max(1, -(-dataset.fetcher.max_in_flight // workers))
        self.pid = os.getpid()
        self._writer = dataset.cache_writer()
        self._running = 0
        self._wake = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._loop, name="turbotrain-read-ahead", daemon=True).start()

    def _done(self, i: int, fut: Future) -> None:
        states, _, _ = self.ds.plan.views()
        with self._lock:
            self._running -= 1
        if fut.cancelled() or fut.exception() is not None:
            states[i] = FAILED
        else:
            self._writer.write(self.ds.urls[i], fut.result(), lambda stored: self._written(i, stored))
        self._wake.set()

    def _written(self, i: int, stored: bool) -> None:
        self.ds.plan.views()[0][i] = DONE if stored else FAILED
        self._wake.set()

    def _loop(self) -> None:
        states, order, control = self.ds.plan.views()
        generation, cursor = -1, self.worker
        while True:
            if control[0] != generation:
                generation, cursor = int(control[0]), self.worker
            planned = int(control[1])
            while cursor < planned and self._running < self.quota and self._writer.pending < 2 * self.quota:
                i = int(order[cursor])
                cursor += self.workers
                if states[i] != NONE:
                    continue
                if self.ds.urls[i] in self.ds.cache:
                    states[i] = DONE
                    continue
                states[i] = CLAIMED
                with self._lock:
                    self._running += 1
                self.ds.fetcher.submit(self.ds.urls[i]).add_done_callback(lambda f, i=i: self._done(i, f))
            self._wake.wait(_PUMP_IDLE_S)  # set by each read that ends; the timeout notices new plan entries
            self._wake.clear()


def read_in_worker(dataset: Any, indices: Sequence[int], patience_s: float) -> dict[int, bytes]:
    """In a DataLoader worker: this batch's files through the shared read-ahead; returns those read here.

    Files no process has claimed yet (the pumps are behind, or the file is not in the plan) are
    claimed here and read at once, as the most urgent reads there are; files another worker (or this
    one's pump) is reading are waited for, up to ``patience_s``. The caller takes everything else
    from the cache, and reads itself what is still missing (a failed read raises there, naming it).
    """
    states, _, _ = dataset.plan.views()
    mine: dict[int, Future] = {}
    for i in dict.fromkeys(indices):
        if states[i] == NONE:
            states[i] = CLAIMED
            mine[i] = dataset.fetcher.submit(dataset.urls[i])
    start = time.monotonic()
    pause, longest = _WAIT_POLL_S
    others = [i for i in indices if i not in mine]
    while True:
        others = [i for i in others if states[i] == CLAIMED]
        if not others or time.monotonic() - start > patience_s:
            break
        time.sleep(pause)
        pause = min(longest, pause * 1.5)
    out: dict[int, bytes] = {}
    for i, fut in mine.items():
        try:
            out[i] = fut.result()
            dataset.store(dataset.urls[i], out[i])
            states[i] = DONE
        except Exception:  # noqa: BLE001 - the caller reads it again and raises with the URL
            states[i] = FAILED
    return out


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
        return len(self.batches)  # type: ignore[arg-type]  # the wrapped loader's len(), or its TypeError

    def __iter__(self) -> Iterator[list[int]]:
        if self.keep_bytes:  # the main process reads: it runs the stream itself
            stream: Any = self.dataset.start_read_ahead()
        else:  # the workers read: they fetch the plan written here
            stream = _PlanWriter(self.dataset.plan)
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
                    stream.finish()
                    return
                batch = pending.popleft()
                pulled -= len(batch)
                yield batch
        finally:
            if not finished:  # abandoned mid-epoch: nobody will ask for what is still planned
                stream.close()


class _PlanWriter:
    """The main process's side with workers: the order goes to the shared plan."""

    def __init__(self, plan: SharedPlan):
        self.plan = plan
        plan.restart()

    def feed(self, indices: Sequence[int]) -> None:
        self.plan.extend(indices)

    def finish(self) -> None:
        pass  # each worker writes what it read

    def close(self) -> None:
        pass  # the workers are stopped with the loader's iterator
