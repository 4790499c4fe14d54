"""Read accounting per URL scheme (bytes, seconds, files), across DataLoader worker processes.

Every read turbotrain's data layer does (a remote fetch, a local file, a cache hit) is added to a
small counter file whose path travels in the ``TURBOTRAIN_READ_STATS`` environment variable, so
reads done in DataLoader workers (fork or spawn) and in child processes land in the same totals
as the main process's. Updates hold an exclusive ``flock`` for a few microseconds; a read costs
far more than that. Where ``fcntl`` is missing (Windows) only this process's reads are counted.

    before = stats.snapshot()
    ...train for a while...
    reads = stats.snapshot() - before
    finding = stats.slow_storage_finding(reads, data_wait_s=..., total_s=...)
"""

from __future__ import annotations

import atexit
import os
import struct
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: process-local counting only
    fcntl = None  # type: ignore[assignment]  # checked before each use

__all__ = [
    "SchemeReads",
    "ReadStats",
    "record",
    "snapshot",
    "share_with_workers",
    "CACHE_SCHEME",
    "ENV_VAR",
    "slow_storage_finding",
]

ENV_VAR = "TURBOTRAIN_READ_STATS"
_MEMFD_NAME = "turbotrain-reads"
_kept: list[int] = []  # memory files this process created, open until it exits
CACHE_SCHEME = "cache"  # reads served by turbotrain's own cache, kept apart from storage reads

_RECORD = struct.Struct("<24sQQQ")  # scheme, bytes, nanoseconds, files
_SLOTS = 32
_SIZE = _RECORD.size * _SLOTS


@dataclass(frozen=True)
class SchemeReads:
    """What was read through one URL scheme."""

    bytes: int = 0
    seconds: float = 0.0
    files: int = 0

    @property
    def mb_per_s(self) -> float:
        """Throughput of one read stream: bytes over the summed read time (MB = 10**6 bytes)."""
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else float("inf")

    def __add__(self, other: "SchemeReads") -> "SchemeReads":
        return SchemeReads(self.bytes + other.bytes, self.seconds + other.seconds, self.files + other.files)

    def __sub__(self, other: "SchemeReads") -> "SchemeReads":
        return SchemeReads(self.bytes - other.bytes, self.seconds - other.seconds, self.files - other.files)


@dataclass(frozen=True)
class ReadStats:
    """Reads per URL scheme (``"http"``, ``"s3"``, ``"file"``, ..., and ``"cache"`` for cache hits)."""

    schemes: dict[str, SchemeReads] = field(default_factory=dict)

    def __sub__(self, other: "ReadStats") -> "ReadStats":
        names = set(self.schemes) | set(other.schemes)
        diff = {n: self.schemes.get(n, SchemeReads()) - other.schemes.get(n, SchemeReads()) for n in names}
        return ReadStats({n: r for n, r in diff.items() if r.files or r.bytes})

    def storage(self) -> dict[str, SchemeReads]:
        """Reads that went to storage, cache hits left out."""
        return {n: r for n, r in self.schemes.items() if n != CACHE_SCHEME}

    def to_dict(self) -> dict[str, Any]:
        return {
            n: {"bytes": r.bytes, "seconds": round(r.seconds, 6), "files": r.files}
            for n, r in sorted(self.schemes.items())
        }


class _CounterFile:
    """The shared counter file: fixed slots of (scheme, bytes, ns, files) under an flock."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._pid = -1
        self._path = ""
        self._lock = threading.Lock()

    def _open(self) -> int | None:
        if fcntl is None:
            return None
        # flock belongs to the open file description, which a forked child shares with its parent:
        # each process must open the file itself or the lock would not keep them apart.
        if self._fd is not None and self._pid == os.getpid() and os.environ.get(ENV_VAR) == self._path:
            return self._fd
        path = os.environ.get(ENV_VAR)
        if not path or not _ours(path):
            path = _new_counter_file()
            os.environ[ENV_VAR] = path  # spawned workers and child processes inherit it
        self._fd = os.open(path, os.O_RDWR)
        self._pid, self._path = os.getpid(), path
        return self._fd

    def add(self, scheme: str, nbytes: int, seconds: float) -> None:
        name = scheme.encode()[:24]
        with self._lock:
            fd = self._open()
            if fd is None:
                _local[scheme] = _local.get(scheme, SchemeReads()) + SchemeReads(nbytes, seconds, 1)
                return
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                raw = os.pread(fd, _SIZE, 0)
                for slot in range(_SLOTS):
                    off = slot * _RECORD.size
                    key, b, ns, n = _RECORD.unpack_from(raw, off)
                    key = key.rstrip(b"\0")
                    if key == name or not key:
                        os.pwrite(fd, _RECORD.pack(name, b + nbytes, ns + int(seconds * 1e9), n + 1), off)
                        return
                # More than 32 schemes in one run: fold the rest into the last slot rather than fail a read.
                key, b, ns, n = _RECORD.unpack_from(raw, (_SLOTS - 1) * _RECORD.size)
                os.pwrite(
                    fd, _RECORD.pack(key, b + nbytes, ns + int(seconds * 1e9), n + 1), (_SLOTS - 1) * _RECORD.size
                )
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def read(self) -> ReadStats:
        with self._lock:
            fd = self._open()
            if fd is None:
                return ReadStats(dict(_local))
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                raw = os.pread(fd, _SIZE, 0)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        out = {}
        for slot in range(_SLOTS):
            key, b, ns, n = _RECORD.unpack_from(raw, slot * _RECORD.size)
            key = key.rstrip(b"\0")
            if key:
                out[key.decode()] = SchemeReads(b, ns / 1e9, n)
        return ReadStats(out)


def _new_counter_file() -> str:
    """A zeroed counter file; its path for the processes this one starts.

    On Linux an anonymous memory file, reached by children through /proc/<pid>/fd/<n>: nothing is left on
    disk whatever ends this process (a SIGKILL runs no exit hook). Elsewhere a temporary file removed at exit.
    """
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create(_MEMFD_NAME, os.MFD_CLOEXEC)  # children open it by path, never inherit the fd
        os.ftruncate(fd, _SIZE)
        _kept.append(fd)  # held open for the process's life: the file lives as long as its creator
        return f"/proc/{os.getpid()}/fd/{fd}"
    fd, path = tempfile.mkstemp(prefix="turbotrain-reads-", suffix=".bin")
    os.ftruncate(fd, _SIZE)
    os.close(fd)
    atexit.register(_remove_if_owner, path, os.getpid())
    return path


def _ours(path: str) -> bool:
    """Whether ``path`` is still a counter file: a /proc path of a creator that has exited may name another
    process's file once its pid is reused."""
    if not path.startswith("/proc/"):
        return os.path.exists(path)
    try:
        return os.readlink(path).startswith(f"/memfd:{_MEMFD_NAME}")
    except OSError:
        return False


def _remove_if_owner(path: str, pid: int) -> None:
    # A forked child that exits through sys.exit runs its parent's atexit hooks: only the creator removes.
    if os.getpid() == pid:
        try:
            os.unlink(path)
        except OSError:
            pass


_local: dict[str, SchemeReads] = {}
_counter = _CounterFile()
# A fork taken while a fetch thread held the lock would leave the child's copy locked forever.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: setattr(_counter, "_lock", threading.Lock()))


def share_with_workers() -> None:
    """Create the shared counter file now, so processes started later (DataLoader workers) count into it.

    The datasets call this when they are built, which is always before their workers start.
    """
    with _counter._lock:
        _counter._open()


def record(scheme: str, nbytes: int, seconds: float) -> None:
    """Count one file read of ``nbytes`` through ``scheme`` that took ``seconds``."""
    _counter.add(scheme, nbytes, seconds)


def snapshot() -> ReadStats:
    """Totals so far for this process, its DataLoader workers and children (subtract two snapshots)."""
    return _counter.read()


def slow_storage_finding(stats: ReadStats, data_wait_s: float, total_s: float) -> dict | None:
    """The doctor's ``slow-storage`` finding, or None when reads are not what the loop waits for.

    ``stats`` are the reads during the measured window (a snapshot difference), ``data_wait_s``
    the time the training loop spent waiting for batches and ``total_s`` the window's length.
    A finding needs the loop to wait on data for at least a fifth of the time and storage reads
    (summed over all processes, cache hits left out) to account for at least half of that wait.
    """
    if total_s <= 0 or data_wait_s <= 0:
        return None
    storage = {n: r for n, r in stats.storage().items() if r.seconds > 0}
    if not storage:
        return None
    wait_share = data_wait_s / total_s
    read_s = sum(r.seconds for r in storage.values())
    if wait_share < 0.2 or read_s < 0.5 * data_wait_s:
        return None
    scheme, worst = max(storage.items(), key=lambda item: item[1].seconds)
    # Reads overlap when workers run in parallel, so they can remove at most the wait itself.
    saved = min(data_wait_s, read_s)
    est = total_s / max(total_s - saved, 1e-9)
    severity = "high" if wait_share >= 0.5 else "medium"
    where = f"{scheme}://" if scheme != "file" else "local files"
    message = (
        f"The training loop waits for data {wait_share:.0%} of the time and reading from {where} "
        f"takes {worst.seconds:.1f} s of it: {worst.files} files, {worst.bytes / 1e6:.1f} MB at "
        f"{worst.mb_per_s:.2f} MB/s per read stream."
    )
    if scheme == "file":
        fix = (
            "Preload the data into RAM once: `ds = tt.data.preload(ds, to='shm')` (or to='memory' with "
            "num_workers=0), or put the files on a faster local disk."
        )
    else:
        fix = (
            "Read through turbotrain's cache: `tt.data.FileDataset(urls, decode=..., cache='/fast/local/dir')` "
            "(cache='shm' when the data fits in RAM; `tt.data.ParquetDataset(urls, cache=...)` for Parquet). "
            "The first epoch fetches with many requests in flight and later epochs read locally."
        )
    return {
        "rule": "slow-storage",
        "severity": severity,
        "where": None,
        "message": message,
        "fix": fix,
        "est_speedup": round(est, 2),
        "measured": False,
        "scheme": scheme,
        "mb_per_s": round(worst.mb_per_s, 3),
    }
