"""The local cache between training and remote storage: a directory, /dev/shm, or this process's RAM.

Entries are whole files keyed by the SHA-256 of their URL. A directory cache outlives the run, so
each entry carries the version of the file it holds (the ETag, or size and modification time, as
the store's listing gave them when it was fetched), in an extended attribute set before the entry
is renamed into place (so the two appear together), or in a ``<key>.v`` file beside it where the
filesystem has no user xattrs. A later run lists each directory once and
:meth:`DiskCache.validate` drops the entries whose file has another version now (or whose version
was never recorded), so they are fetched again instead of served stale.

A disk entry is written to a temporary name in the same directory and renamed into place, so a
reader (another worker, another training process on the machine) sees either nothing or the
whole file: a crash, a killed worker or a full disk never leaves a half-written entry that could
be served. Two processes that fetch the same file both write complete copies and the last rename
wins; the contents are the same bytes.

``clear_cache`` deletes only names turbotrain writes (64-hex entry names and ``.tmp-`` files inside
two-hex subdirectories of a directory carrying turbotrain's marker file), never anything else.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import itertools
import threading
import time
from pathlib import Path
from typing import Any

from . import stats
from .fetch import Fetcher
from .versions import listed_versions, same_version

__all__ = ["MemoryCache", "DiskCache", "CacheFullError", "open_cache", "clear_cache", "shm_dir"]

log = logging.getLogger("turbotrain")

MARKER = ".turbotrain-cache"
_ENTRY = re.compile(r"^[0-9a-f]{64}(\.v)?$")
_VERSION_SUFFIX = ".v"
_XATTR = "user.turbotrain.version"
_SUBDIR = re.compile(r"^[0-9a-f]{2}$")
_TMP_PREFIX = ".tmp-"
STALE_TMP_S = 3600.0  # a temp file this old belongs to a writer that died
_seq = itertools.count()


class CacheFullError(OSError):
    """The cache's disk (or quota) is full; nothing partial was left behind."""


def _write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` with plain os.write (a buffered file object per entry costs more than the write)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]  # a regular file may take less than asked (a signal, a full disk)


def _key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()


class MemoryCache:
    """Files kept in this process's RAM.

    Each process has its own: a DataLoader worker's entries do not reach the other workers or
    the main process. Fill it before the workers start (``dataset.fill()`` or ``tt.data.preload``),
    where fork shares it copy-on-write and spawn copies it, or use ``"shm"``, which all share.
    """

    kind = "memory"

    def __init__(self) -> None:
        self._entries: dict[str, bytes] = {}

    def get(self, url: str) -> bytes | None:
        data = self._entries.get(url)
        if data is not None:
            stats.record(stats.CACHE_SCHEME, len(data), 0.0)
        return data

    def __contains__(self, url: str) -> bool:
        return url in self._entries

    def put(self, url: str, data: bytes, version: Any = None) -> None:
        self._entries[url] = data  # lives as long as this process: no version to keep

    def local_path(self, url: str) -> str | None:
        return None

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"MemoryCache({len(self._entries)} files)"


class DiskCache:
    """Files kept in a local directory (a fast disk, or /dev/shm), shared by every process that uses it."""

    kind = "disk"

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).expanduser()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            marker = self.root / MARKER
            if not marker.exists():
                marker.write_text(
                    "turbotrain cache: entries are named by the SHA-256 of their URL. "
                    "turbotrain.data.clear_cache(dir) removes only those entries.\n"
                )
        except OSError as exc:
            raise OSError(
                f"cannot use {self.root} as a cache directory: {exc}. Pass cache= a writable "
                "local directory, 'memory', 'shm' or None."
            ) from exc
        self._root = str(self.root)
        self._made: set[str] = set()  # entry subdirectories known to exist
        self._sweep_stale_temps()

    def __repr__(self) -> str:
        return f"DiskCache({str(self.root)!r})"

    def entry_path(self, url: str) -> Path:
        return Path(self._entry(url))

    def _entry(self, url: str) -> str:
        key = _key(url)  # plain strings: this runs for every file of every epoch
        return f"{self._root}/{key[:2]}/{key}"

    def __contains__(self, url: str) -> bool:
        return os.path.exists(self._entry(url))

    def local_path(self, url: str) -> str | None:
        path = self.entry_path(url)
        return str(path) if path.exists() else None

    def get(self, url: str) -> bytes | None:
        t0 = time.perf_counter()
        try:
            with open(self._entry(url), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        stats.record(stats.CACHE_SCHEME, len(data), time.perf_counter() - t0)
        return data

    def version_path(self, url: str) -> Path:
        return self.entry_path(url).with_suffix(_VERSION_SUFFIX)

    def recorded_version(self, url: str) -> Any:
        """The version recorded with ``url``'s entry (None when there is none)."""
        try:
            raw = os.getxattr(self.entry_path(url), _XATTR)
        except OSError:
            try:
                raw = self.version_path(url).read_bytes()
            except OSError:
                return None
        try:
            record = json.loads(raw)
        except ValueError:
            return None
        return record.get("version") if record.get("url") == url else None

    def _record_version(self, fd: int, url: str, version: Any) -> None:
        raw = json.dumps({"url": url, "version": version}).encode()
        try:
            os.setxattr(fd, _XATTR, raw)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.E2BIG):
                raise
        # No user xattrs here: a file beside the entry. A torn one (a crash while writing these
        # few bytes) reads as no version, and the entry is fetched again.
        side = os.open(self.version_path(url), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(side, raw)
        finally:
            os.close(side)

    def validate(self, versions: dict[str, Any]) -> int:
        """Drop the entries of ``versions``' URLs whose recorded version differs from the current one.

        ``versions`` maps URL to its version now (from a listing); an entry without a recorded version
        is dropped as well, since nothing says it is current. Returns how many entries went.
        """
        dropped = 0
        for url, now in versions.items():
            entry = self.entry_path(url)
            if not entry.exists():
                continue
            if now is not None and same_version(self.recorded_version(url), now):
                continue
            for path in (entry, self.version_path(url)):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            dropped += 1
        return dropped

    def put(self, url: str, data: bytes, version: Any = None) -> None:
        """Store ``url``'s bytes (and, for a later run's check, the ``version`` they are)."""
        final = self._entry(url)
        if os.path.exists(final):
            return  # another process already wrote it: the same file, fetched in this run
        sub, name = final.rsplit("/", 1)
        tmp = None
        try:
            if name[:2] not in self._made:
                os.makedirs(sub, exist_ok=True)
                self._made.add(name[:2])
            # A name no other writer (process or thread) uses, without mkstemp's cost per file.
            tmp = f"{sub}/{_TMP_PREFIX}{name[:16]}-{os.getpid()}-{threading.get_ident()}-{next(_seq)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_all(fd, data)
                if version is not None:  # before the rename: the entry never appears without it
                    self._record_version(fd, url, version)
            finally:
                os.close(fd)
            os.replace(tmp, final)  # atomic: readers see no file or the whole file
            tmp = None
        except FileNotFoundError:
            if name[:2] not in self._made:
                raise
            self._made.discard(name[:2])  # removed since (clear_cache in another process)
            self.put(url, data, version)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                free = shutil.disk_usage(self.root).free
                raise CacheFullError(
                    exc.errno,
                    f"cache directory {self.root} is full ({free / 1e6:.1f} MB free) while storing "
                    f"{len(data) / 1e6:.1f} MB for {url}; no partial file was kept. Free space there, point "
                    "cache= at a larger disk, or use cache=None.",
                ) from exc
            raise
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def _claim_path(self, url: str) -> str:
        sub, name = self._entry(url).rsplit("/", 1)
        return f"{sub}/{_TMP_PREFIX}claim-{name}"

    def claim(self, url: str) -> bool:
        """Take the job of fetching ``url`` for every process using this cache; False if another has it.

        The claim is a file created exclusively next to where the entry goes; a claim older than
        ``STALE_TMP_S`` (its owner died) is taken over. ``release`` ends it.
        """
        path = self._claim_path(url)
        os.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return True
        except FileExistsError:
            try:
                stale = time.time() - os.stat(path).st_mtime > STALE_TMP_S
            except FileNotFoundError:
                return self.claim(url)
            if stale:
                os.unlink(path)
                return self.claim(url)
            return False

    def claimed(self, url: str) -> bool:
        return os.path.exists(self._claim_path(url))

    def release(self, url: str) -> None:
        try:
            os.unlink(self._claim_path(url))
        except FileNotFoundError:
            pass

    def _our_files(self):
        """(path, is_temp) for every file turbotrain wrote here; nothing else is ever listed."""
        if not (self.root / MARKER).exists():
            return
        for sub in os.scandir(self.root):
            if not (sub.is_dir(follow_symlinks=False) and _SUBDIR.match(sub.name)):
                continue
            for entry in os.scandir(sub.path):
                if not entry.is_file(follow_symlinks=False):
                    continue
                if _ENTRY.match(entry.name) and entry.name.startswith(sub.name):
                    yield entry, False
                elif entry.name.startswith(_TMP_PREFIX):
                    yield entry, True

    def _sweep_stale_temps(self) -> None:
        now = time.time()
        for entry, is_temp in self._our_files():
            if is_temp:
                try:
                    if now - entry.stat().st_mtime > STALE_TMP_S:
                        os.unlink(entry.path)
                except OSError:
                    pass

    def clear(self) -> int:
        """Delete this cache's entries (and leftover temp files); returns how many files went."""
        removed = 0
        for entry, _ in list(self._our_files()):
            try:
                os.unlink(entry.path)
                removed += 1
            except FileNotFoundError:
                pass
        for sub in os.scandir(self.root):
            if sub.is_dir(follow_symlinks=False) and _SUBDIR.match(sub.name):
                try:
                    os.rmdir(sub.path)  # only if empty: a user's file in there stays, and so does the dir
                except OSError:
                    pass
        return removed


def shm_dir() -> Path:
    """The shared-memory cache directory (/dev/shm/turbotrain-cache-<uid>)."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        raise OSError("cache='shm' needs /dev/shm, which this system lacks; pass a local directory instead")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return shm / f"turbotrain-cache-{uid}"


def open_cache(spec: Any) -> MemoryCache | DiskCache | None:
    """A cache from its spec: None, ``"memory"``, ``"shm"``, a directory path, or a cache object."""
    if spec is None or isinstance(spec, (MemoryCache, DiskCache)):
        return spec
    if spec == "memory":
        return MemoryCache()
    if spec == "shm":
        return DiskCache(shm_dir())
    if isinstance(spec, (str, os.PathLike)):
        if "://" in os.fspath(spec):
            raise ValueError(f"cache={spec!r}: the cache must be a local directory, 'memory', 'shm' or None")
        return DiskCache(spec)
    raise TypeError(f"cache={spec!r}: expected a local directory, 'memory', 'shm' or None")


def clear_cache(directory: str | os.PathLike | None = None) -> int:
    """Delete turbotrain's cache entries in ``directory`` (default: the shm cache); returns files removed.

    Refuses a directory that turbotrain did not set up as a cache, and leaves every file whose
    name turbotrain would not have written.
    """
    root = Path(directory) if directory is not None else shm_dir()
    if not root.exists():
        return 0
    if not (root / MARKER).exists():
        raise ValueError(f"{root} is not a turbotrain cache (no {MARKER} marker): nothing deleted")
    return DiskCache(root).clear()


def checked_versions(urls: list[str], fetcher: Fetcher, cache: Any) -> dict[str, Any]:
    """The files' versions now, with ``cache``'s entries of older versions dropped (a directory cache only).

    A RAM cache lives no longer than the run, so it needs none: an empty dict then.
    """
    if not isinstance(cache, DiskCache):
        return {}
    versions = listed_versions(urls, fetcher, cache.recorded_version)
    dropped = cache.validate(versions)
    if dropped:
        log.info(
            "turbotrain: %d cached file(s) changed on the store since they were cached; they are fetched again", dropped
        )
    return versions
