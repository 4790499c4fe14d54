"""Reading whole files from any fsspec URL: many requests in flight, bounded retries, clear errors.

One ``Fetcher`` per dataset. It keeps no state that breaks across processes: the filesystem
object and the thread pool are made lazily per process id, so a DataLoader worker started by
fork or spawn builds its own (an aiohttp session or a thread pool inherited through fork is
unusable in the child).

Concurrency: on async filesystems (http, s3, gcs) ``submit`` runs each read as a coroutine on
fsspec's event loop, at most ``max_in_flight`` at once (a semaphore), with no thread per request;
sync ones (local, alluxiofs, ...) run in a thread pool of ``max_in_flight`` threads. Either way each
file keeps its own retry count, and ``read`` (blocking, on the calling thread) retries the same way.

Fork and the parent's event loop. fsspec runs every async filesystem of a process on one event
loop thread, whose epoll instance a forked child shares (an epoll file descriptor refers to one
kernel object in both processes). A child that drops the filesystem objects it inherited (fsspec
clears its instance cache in a new process; turbotrain makes fresh ones per process) runs their
finalizers, which close the parent's pooled connections: each close is an ``EPOLL_CTL_DEL`` on that
shared epoll, so the parent's loop is no longer told when those sockets have data and its next
requests on them hang until the socket read timeout (the 30-second stall after a DataLoader's
forked workers had run). ``_disown_parent_loops`` runs in every forked child and gives the loops it
inherited a private selector and wake-up pipe, so nothing the child does reaches the parent's loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import selectors
import socket
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from . import stats

__all__ = ["RetryPolicy", "FetchError", "Fetcher", "scheme_of", "expand_urls"]

log = logging.getLogger("turbotrain")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try before giving up on one file.

    ``attempts`` tries in all, waiting ``backoff_s`` * 2**k (with jitter, at most ``max_backoff_s``)
    between them. ``timeout_s`` bounds connecting and each socket read on http(s) URLs (other
    filesystems keep their own timeouts). A missing file (HTTP 404, no such key) fails at once
    unless ``retry_missing``: retrying cannot make a wrong URL right, it only delays the error.

    ``attempt_timeout_s`` bounds one whole attempt on async filesystems (http, s3, gcs) except the
    last, so one stuck request is cancelled and retried instead of holding a batch: None (the default)
    adapts it to the store, ``attempt_scale`` times the slowest tenth of recent reads and at least
    ``min_attempt_s``; ``math.inf`` turns it off. The last attempt is bounded by ``timeout_s`` only,
    so a file that is legitimately slow still arrives.
    """

    attempts: int = 4
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    timeout_s: float = 30.0
    retry_missing: bool = False
    attempt_timeout_s: float | None = None
    min_attempt_s: float = 2.0
    attempt_scale: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if self.attempt_timeout_s is not None and self.attempt_timeout_s <= 0:
            raise ValueError(
                f"RetryPolicy.attempt_timeout_s must be positive (math.inf: off), got {self.attempt_timeout_s}"
            )

    def delay(self, failures: int) -> float:
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (failures - 1))
        return base * (0.5 + random.random() / 2)  # jitter: many workers must not retry in lock-step


class FetchError(OSError):
    """A file could not be read after all retries; ``url`` names it."""

    def __init__(self, url: str, message: str):
        super().__init__(message)
        self.url = url


def scheme_of(url: str) -> str:
    """The URL's scheme as fsspec sees it: ``"file"`` for plain paths."""
    from fsspec.utils import get_protocol

    return get_protocol(str(url))


def _permanent(exc: BaseException, policy: RetryPolicy) -> bool:
    if isinstance(exc, FileNotFoundError):
        return not policy.retry_missing
    if isinstance(exc, (PermissionError, IsADirectoryError, NotADirectoryError, ValueError, TypeError, ImportError)):
        return True
    status = getattr(exc, "status", None)  # aiohttp.ClientResponseError and friends
    if isinstance(status, int):
        return not (status >= 500 or status in (408, 425, 429))
    return False  # connection resets, timeouts, truncated bodies, 5xx: worth another try


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    text = str(exc) or type(exc).__name__
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) and not str(exc):
        text = "timed out"
    return f"HTTP {status}: {text}" if isinstance(status, int) else f"{type(exc).__name__}: {text}"


class _Latencies:
    """Durations of recent successful reads, to bound an attempt by what this store usually takes."""

    SIZE = 256

    def __init__(self) -> None:
        self.recent: deque[float] = deque(maxlen=self.SIZE)

    def add(self, seconds: float) -> None:
        self.recent.append(seconds)

    def slow(self) -> float | None:
        """The slowest tenth's start (p90) once 16 reads are known, else None."""
        if len(self.recent) < 16:
            return None
        ordered = sorted(self.recent)
        return ordered[int(0.9 * (len(ordered) - 1))]


def _filesystem(protocol: str, storage_options: dict[str, Any], timeout_s: float):
    import fsspec

    options = dict(storage_options)
    if protocol in ("http", "https"):
        client_kwargs = dict(options.get("client_kwargs") or {})
        if "timeout" not in client_kwargs:
            import aiohttp

            # No total limit (a big file may take long), but a stalled connection must not hang a worker.
            client_kwargs["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
        options["client_kwargs"] = client_kwargs
    return fsspec.filesystem(protocol, **options)


_inherited_loops: list = []


def _loops_in_use() -> list:
    asyn = sys.modules.get("fsspec.asyn")
    loop = asyn.loop[0] if asyn is not None else None
    return [loop] if loop is not None else []


def _remember_loops() -> None:
    _inherited_loops[:] = _loops_in_use()


def _forget_loops() -> None:
    _inherited_loops.clear()


def _disown_parent_loops() -> None:
    """In a forked child: cut every inherited event loop off the parent's epoll and wake-up pipe.

    The loop objects stay (filesystems the child inherited refer to them, and their finalizers
    will close sessions on them), but closing a transport now unregisters it from a selector of
    the child's own, wakes a pipe of the child's own, and finds the loop not running.
    """
    for loop in _inherited_loops:
        if not isinstance(loop, asyncio.selector_events.BaseSelectorEventLoop):
            continue
        # asyncio's private loop state (untyped): replacing it is what this function is for.
        loop._selector = selectors.DefaultSelector()  # type: ignore[attr-defined]  # private, see above
        loop._ssock, loop._csock = socket.socketpair()  # type: ignore[attr-defined]  # the parent keeps the old pair
        loop._thread_id = None  # type: ignore[attr-defined]  # the thread that ran it exists only in the parent
    _inherited_loops.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_remember_loops, after_in_parent=_forget_loops, after_in_child=_disown_parent_loops)


def expand_urls(urls: Any, storage_options: dict[str, Any] | None = None) -> list[str]:
    """A list of URLs from a list, a single URL, or a glob pattern (``s3://bucket/train/*.jpg``)."""
    import fsspec

    if isinstance(urls, (str, os.PathLike)):
        pattern = os.fspath(urls)
        if not any(ch in pattern for ch in "*?["):
            return [pattern]
        fs, path = fsspec.core.url_to_fs(pattern, **(storage_options or {}))
        found = sorted(fs.unstrip_protocol(p) if scheme_of(pattern) != "file" else p for p in fs.glob(path))
        if not found:
            raise FileNotFoundError(f"no files match {pattern!r}: check the pattern and that the files exist")
        return found
    out = [os.fspath(u) for u in urls]
    if not out:
        raise ValueError("no URLs given: pass a non-empty list of files or a glob pattern")
    return out


class Fetcher:
    """Reads whole files with up to ``max_in_flight`` requests outstanding, retrying per ``retry``."""

    def __init__(
        self, storage_options: dict[str, Any] | None = None, max_in_flight: int = 32, retry: RetryPolicy | None = None
    ):
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.storage_options = dict(storage_options or {})
        self.max_in_flight = max_in_flight
        self.retry = retry or RetryPolicy()
        self._per_process: dict[str, Any] = {}
        self._pid = -1
        self._lock = threading.Lock()
        self.latencies = _Latencies()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_per_process"], state["_pid"], state["_lock"] = {}, -1, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _local(self) -> dict[str, Any]:
        if self._pid != os.getpid():  # a fresh process (fork or spawn): nothing inherited is usable
            self._per_process, self._pid, self._lock = {}, os.getpid(), threading.Lock()
        return self._per_process

    def filesystem(self, url: str):
        """This process's fsspec filesystem for ``url``'s scheme, and the path inside it."""
        protocol = scheme_of(url)
        local = self._local()
        with self._lock:
            fs = local.get(protocol)
            if fs is None:
                fs = local[protocol] = _filesystem(protocol, self.storage_options, self.retry.timeout_s)
        return fs, fs._strip_protocol(url)

    def pool(self) -> ThreadPoolExecutor:
        local = self._local()
        with self._lock:
            pool = local.get("pool")
            if pool is None:
                pool = local["pool"] = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix="turbotrain-fetch")
        return pool

    def attempt_timeout(self, attempt: int) -> float | None:
        """The bound on attempt ``attempt`` (1-based) as a whole, or None (socket timeouts only)."""
        policy = self.retry
        if attempt >= policy.attempts:
            return None
        if policy.attempt_timeout_s is not None:
            return None if math.isinf(policy.attempt_timeout_s) else policy.attempt_timeout_s
        slow = self.latencies.slow()
        return None if slow is None else min(policy.timeout_s, max(policy.min_attempt_s, policy.attempt_scale * slow))

    def call(self, url: str, op: Callable[[Any, str, dict[str, Any]], Any], nbytes: Callable[[Any], int]) -> Any:
        """``op(fs, path, kwargs)`` for ``url``, retried per the policy; raises FetchError or FileNotFoundError.

        ``kwargs`` carries the per-attempt ``timeout`` on async filesystems; ``nbytes(result)`` is
        what the read counts for in the read statistics.
        """
        from fsspec.asyn import AsyncFileSystem

        policy = self.retry
        started = time.perf_counter()
        for attempt in range(1, policy.attempts + 1):
            t0 = time.perf_counter()
            try:
                fs, path = self.filesystem(url)
                limit = self.attempt_timeout(attempt) if isinstance(fs, AsyncFileSystem) else None
                result = op(fs, path, {"timeout": limit} if limit is not None else {})
            except Exception as exc:  # noqa: BLE001 - classified, re-raised with the URL
                time.sleep(self._retry_wait(url, exc, attempt, started))
                continue
            return self._count(url, nbytes(result), t0, result)
        raise AssertionError("unreachable")

    def _retry_wait(self, url: str, exc: Exception, attempt: int, started: float) -> float:
        """How long to wait before the next attempt after ``exc``; raises when there is none to make."""
        policy = self.retry
        if isinstance(exc, FileNotFoundError) and not policy.retry_missing:
            raise FileNotFoundError(
                f"{url}: no such file (HTTP 404 or missing object). Check the URL, "
                "or the list or glob given to the dataset."
            ) from exc
        if _permanent(exc, policy) or attempt == policy.attempts:
            raise FetchError(
                url,
                f"could not read {url}: {_describe(exc)} (attempt {attempt} of "
                f"{policy.attempts}, {time.perf_counter() - started:.1f} s). Check "
                "that the server is up and the URL right; RetryPolicy(attempts=..., "
                "timeout_s=...) sets how hard to try.",
            ) from exc
        wait = policy.delay(attempt)
        log.debug("turbotrain: retrying %s in %.2f s after %s", url, wait, _describe(exc))
        return wait

    def _count(self, url: str, nbytes: int, t0: float, result: Any) -> Any:
        took = time.perf_counter() - t0
        self.latencies.add(took)
        stats.record(scheme_of(url), nbytes, took)
        return result

    def _slots(self) -> asyncio.Semaphore:
        """This process's bound on requests in flight on the event loop (made there, on first use)."""
        local = self._local()
        slots = local.get("slots")
        if slots is None:
            slots = local["slots"] = asyncio.Semaphore(self.max_in_flight)
        return slots

    async def _read_async(self, fs: Any, url: str, path: str, start: int | None, end: int | None) -> bytes:
        """``read`` (of bytes ``[start, end)`` when given) as a coroutine on the filesystem's event loop."""
        started = time.perf_counter()
        for attempt in range(1, self.retry.attempts + 1):
            try:
                async with self._slots():  # max_in_flight requests at once, as the thread pool bounds reads
                    t0 = time.perf_counter()
                    data = await asyncio.wait_for(
                        fs._cat_file(path, start=start, end=end), self.attempt_timeout(attempt)
                    )
            except Exception as exc:  # noqa: BLE001 - classified, re-raised with the URL
                await asyncio.sleep(self._retry_wait(url, exc, attempt, started))
                continue
            return self._count(url, len(data), t0, bytes(data))
        raise AssertionError("unreachable")

    def read(self, url: str) -> bytes:
        """All bytes of ``url``, retried per the policy; raises FetchError or FileNotFoundError naming it."""
        return bytes(self.call(url, lambda fs, path, kw: fs.cat_file(path, **kw), len))

    def read_range(self, url: str, start: int, end: int | None) -> bytes:
        """Bytes ``[start, end)`` of ``url`` (to its end when ``end`` is None), retried like ``read``."""
        return bytes(self.call(url, lambda fs, path, kw: fs.cat_file(path, start=start, end=end, **kw), len))

    def submit(self, url: str, start: int | None = None, end: int | None = None) -> Future:
        """Start reading ``url`` (bytes ``[start, end)`` when given); the Future's result is the bytes.

        On async filesystems (http, s3, gcs) the read runs as a coroutine on fsspec's event loop, so
        ``max_in_flight`` requests cost no threads (and no thread switches); other filesystems use the
        thread pool. Callbacks added to the Future may then run on the event loop's thread: keep them short.
        """
        from fsspec.asyn import AsyncFileSystem

        fs, path = self.filesystem(url)
        if isinstance(fs, AsyncFileSystem) and not fs.asynchronous and getattr(fs, "loop", None) is not None:
            return asyncio.run_coroutine_threadsafe(self._read_async(fs, url, path, start, end), fs.loop)
        if start is None:
            return self.pool().submit(self.read, url)
        return self.pool().submit(self.read_range, url, start, end)

    def read_many(self, urls: Iterable[str]) -> Iterator[tuple[str, bytes]]:
        """(url, bytes) for each URL in order, with up to ``max_in_flight`` reads running ahead.

        Submission is windowed so a long list never holds more than a window of files in memory.
        On an error the reads already submitted are cancelled where they have not started.
        """
        pending: deque[tuple[str, Future]] = deque()
        it = iter(urls)
        window = self.max_in_flight * 2
        try:
            for url in it:
                pending.append((url, self.submit(url)))
                if len(pending) >= window:
                    head, fut = pending.popleft()
                    yield head, fut.result()
            while pending:
                head, fut = pending.popleft()
                yield head, fut.result()
        finally:
            for _, fut in pending:
                fut.cancel()

    def fill(self, cache, urls: Iterable[str], versions: dict[str, Any] | None = None) -> None:
        """Fetch each URL not yet in ``cache`` into it, many at once (recording ``versions[url]``)."""
        versions = versions or {}
        for url, data in self.read_many([u for u in dict.fromkeys(urls) if u not in cache]):
            cache.put(url, data, versions.get(url))
