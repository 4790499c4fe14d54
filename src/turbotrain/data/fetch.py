"""Reading whole files from any fsspec URL: many requests in flight, bounded retries, clear errors.

One ``Fetcher`` per dataset. It keeps no state that breaks across processes: the filesystem
object and the thread pool are made lazily per process id, so a DataLoader worker started by
fork or spawn builds its own (an aiohttp session or a thread pool inherited through fork is
unusable in the child).

Concurrency uses a thread pool for every filesystem: async ones (http, s3) funnel the calls
into fsspec's event loop, sync ones (local, alluxiofs, ...) run in parallel threads; either way
``max_in_flight`` requests are outstanding at once, and each file keeps its own retry count.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

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
    """

    attempts: int = 4
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    timeout_s: float = 30.0
    retry_missing: bool = False

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")

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
    if isinstance(exc, (PermissionError, IsADirectoryError, NotADirectoryError, ValueError, TypeError,
                        ImportError)):
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


def _filesystem(protocol: str, storage_options: dict[str, Any], timeout_s: float):
    import fsspec

    options = dict(storage_options)
    if protocol in ("http", "https"):
        client_kwargs = dict(options.get("client_kwargs") or {})
        if "timeout" not in client_kwargs:
            import aiohttp

            # No total limit (a big file may take long), but a stalled connection must not hang a worker.
            client_kwargs["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s,
                                                             sock_read=timeout_s)
        options["client_kwargs"] = client_kwargs
    return fsspec.filesystem(protocol, **options)


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

    def __init__(self, storage_options: dict[str, Any] | None = None, max_in_flight: int = 32,
                 retry: RetryPolicy | None = None):
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.storage_options = dict(storage_options or {})
        self.max_in_flight = max_in_flight
        self.retry = retry or RetryPolicy()
        self._per_process: dict[str, Any] = {}
        self._pid = -1
        self._lock = threading.Lock()

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

    def read(self, url: str) -> bytes:
        """All bytes of ``url``, retried per the policy; raises FetchError or FileNotFoundError naming it."""
        policy = self.retry
        started = time.perf_counter()
        for attempt in range(1, policy.attempts + 1):
            t0 = time.perf_counter()
            try:
                fs, path = self.filesystem(url)
                data = fs.cat_file(path)
            except Exception as exc:  # noqa: BLE001 - classified below, re-raised with the URL
                if isinstance(exc, FileNotFoundError) and not policy.retry_missing:
                    raise FileNotFoundError(f"{url}: no such file (HTTP 404 or missing object). Check the URL, "
                                            "or the list or glob given to the dataset.") from exc
                if _permanent(exc, policy) or attempt == policy.attempts:
                    raise FetchError(url, f"could not read {url}: {_describe(exc)} (attempt {attempt} of "
                                          f"{policy.attempts}, {time.perf_counter() - started:.1f} s). Check "
                                          "that the server is up and the URL right; RetryPolicy(attempts=..., "
                                          "timeout_s=...) sets how hard to try.") from exc
                wait = policy.delay(attempt)
                log.debug("turbotrain: retrying %s in %.2f s after %s", url, wait, _describe(exc))
                time.sleep(wait)
                continue
            stats.record(scheme_of(url), len(data), time.perf_counter() - t0)
            return bytes(data)
        raise AssertionError("unreachable")

    def submit(self, url: str) -> Future:
        return self.pool().submit(self.read, url)

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

    def fill(self, cache, urls: Iterable[str]) -> None:
        """Fetch each URL not yet in ``cache`` into it, many at once."""
        for url, data in self.read_many([u for u in dict.fromkeys(urls) if u not in cache]):
            cache.put(url, data)
