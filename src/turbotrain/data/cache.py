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

A cache folder is private to its user: created 0700 (entries, records and claims 0600), and an
existing one is checked before anything in it is trusted (:func:`private_dir`): a folder owned by
another user, or one others can write that already holds files, is refused, since its owner could
read the cached bytes and swap them for their own. The default ``"shm"`` folder
(/dev/shm/turbotrain-cache-<uid>) has a name anyone can take first; when another user holds it,
turbotrain uses a private /dev/shm/turbotrain-cache-<uid>-<random> instead, which later runs find
again (:func:`shm_dir`). A record holds the SHA-256 of the URL, never the URL, so no credential or
signed query of a URL is kept on disk.

Each record also holds the entry's length: an entry whose length differs from its record (a
truncated copy, a disk fault) is dropped when read and fetched again.

A claim (:meth:`DiskCache.claim`, used by Parquet so that processes sharing a cache fetch each file
once) records its owner: host, boot id, pid namespace, pid and the process's start time, so a claim
whose process is gone (killed, the machine rebooted, the pid reused) is taken over at once instead
of being waited on.

``clear_cache`` deletes only names turbotrain writes (64-hex entry names and ``.tmp-`` files inside
two-hex subdirectories of a directory carrying turbotrain's marker file), never anything else.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from . import stats
from .fetch import Fetcher
from .versions import listed_versions, same_version

__all__ = [
    "MemoryCache",
    "DiskCache",
    "CacheFullError",
    "UnsafeCacheDirError",
    "open_cache",
    "clear_cache",
    "shm_dir",
    "private_dir",
]

log = logging.getLogger("turbotrain")

MARKER = ".turbotrain-cache"
_ENTRY = re.compile(r"^[0-9a-f]{64}(\.v)?$")
_VERSION_SUFFIX = ".v"
_XATTR = "user.turbotrain.version"
_SUBDIR = re.compile(r"^[0-9a-f]{2}$")
_TMP_PREFIX = ".tmp-"
STALE_TMP_S = 3600.0  # a temp file this old belongs to a writer that died
# A claim is created first and its owner written right after: one still empty this long after its
# creation was left by a process that died in between (or by a turbotrain without owner records).
CLAIM_WRITE_S = 5.0
SHM_ROOT = "/dev/shm"
_DIR_MODE = 0o700
_FILE_MODE = 0o600
_seq = itertools.count()


class CacheFullError(OSError):
    """The cache's disk (or quota) is full; nothing partial was left behind."""


class UnsafeCacheDirError(PermissionError):
    """A cache folder another user could read or write into: refused instead of trusted."""


def _user(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def redact_url(url: str) -> str:
    """``url`` without what may be a secret (user:password@, the query string), for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<an unparsable URL>"
    netloc = parts.hostname or ""
    if parts.port is not None:
        netloc += f":{parts.port}"
    if parts.username or parts.password:
        netloc = "***@" + netloc
    return urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "", ""))


def private_dir(path: str | os.PathLike, what: str = "cache directory") -> Path:
    """``path`` as a folder only this user can enter (made 0700 when new), checked before anything in it is trusted.

    Refuses with :class:`UnsafeCacheDirError` a folder owned by another user, a symbolic link made by
    another user (root's are trusted), and a folder other users can write that already holds
    something (any of it could have been planted or swapped). A folder of this user that others could
    only read is made 0700 (nobody else could have put anything there); so is an empty one others
    could write (a fresh mount, a folder made under a loose umask), after which nobody else can.
    """
    path = Path(path).expanduser()
    me = os.geteuid()
    for attempt in range(2):
        try:
            os.mkdir(path, _DIR_MODE)
            os.chmod(path, _DIR_MODE)  # the umask may have taken bits away; it never adds any
        except FileExistsError:
            pass
        except FileNotFoundError:
            if attempt:
                raise
            path.parent.mkdir(parents=True, exist_ok=True)  # as the user's umask makes them: only the leaf is ours
            continue
        break
    link = os.lstat(path)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise UnsafeCacheDirError(
            f"{what} {path} is a symbolic link made by {_user(link.st_uid)}, not by you ({_user(me)}): it can "
            "point turbotrain at a folder of theirs. Remove the link, or pass cache= a folder of your own."
        )
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, f"{what} {path} exists and is not a folder; pass another path")
    if st.st_uid != me:
        raise UnsafeCacheDirError(
            f"{what} {path} belongs to {_user(st.st_uid)}, not to you ({_user(me)}): its owner could read what "
            "turbotrain caches there and replace it with bytes of their own. Have it removed (by its owner or "
            "root), or pass cache= a folder of your own."
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        os.chmod(path, _DIR_MODE)  # first: from here on nobody else can add anything
        with os.scandir(path) as it:
            holds = next(it, None) is not None
        if holds:
            os.chmod(path, mode)  # refused: leave the user's folder as it was
            raise UnsafeCacheDirError(
                f"{what} {path} is writable by other users (mode {mode:o}) and already holds files: any of them "
                f"could have been planted or swapped. If you trust them, run `chmod 700 {path}`; otherwise empty it "
                "(tt.data.clear_cache) or pass cache= another folder."
            )
        log.warning("turbotrain: %s %s was writable by other users (mode %o); made it private (0700)", what, path, mode)
    elif mode & 0o077:
        os.chmod(path, _DIR_MODE)  # only readable by others until now: nothing in it can be theirs
        log.info("turbotrain: %s %s was readable by other users (mode %o); made it private (0700)", what, path, mode)
    return path


def _read_small(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(4096)
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of process ``pid``; None when there is no such process."""
    raw = _read_small(f"/proc/{pid}/stat")
    if raw is None:
        if os.path.isdir("/proc/self"):
            return None
        try:  # no /proc (not Linux): whether it exists is all that can be known
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ("?", "")
    fields = raw[raw.rfind(b")") + 2 :].split()  # the name in parentheses may hold spaces
    if len(fields) < 20:
        return ("?", "")  # a format this code does not know: the process exists, its start time is unknown
    return fields[0].decode(), fields[19].decode()


_OWNER: dict[str, Any] = {}


def _this_process() -> dict[str, Any]:
    """What identifies this process on this machine, for the claims it makes (cached per pid)."""
    pid = os.getpid()
    if _OWNER.get("pid") != pid:
        boot = (_read_small("/proc/sys/kernel/random/boot_id") or b"").decode().strip()
        try:
            ns = os.readlink("/proc/self/ns/pid")
        except OSError:
            ns = ""
        found = _proc_stat(pid)
        _OWNER.clear()
        _OWNER.update(host=socket.gethostname(), boot=boot, pidns=ns, pid=pid, start=found[1] if found else "")
    return dict(_OWNER)


def _owner_gone(owner: dict[str, Any]) -> bool | None:
    """Whether the process that wrote a claim has ended; None when this machine cannot tell (another host
    or pid namespace sharing the folder)."""
    me = _this_process()
    if owner.get("host") != me["host"]:
        return None
    if owner.get("boot") and me["boot"] and owner.get("boot") != me["boot"]:
        return True  # the machine restarted since: every process of that boot is gone
    if owner.get("pidns") != me["pidns"]:
        return None
    found = _proc_stat(int(owner.get("pid", 0))) if isinstance(owner.get("pid"), int) else None
    if found is None or found[0] in ("Z", "X"):
        return True  # no such process, or one killed and not yet reaped
    return bool(owner.get("start")) and bool(found[1]) and found[1] != owner["start"]  # the pid was reused


def _write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` with plain os.write (a buffered file object per entry costs more than the write)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]  # a regular file may take less than asked (a signal, a full disk)


def _key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()


# How _record_version writes a record's first two fields (json.dumps keeps the order it is given).
_RECORD_HEAD = re.compile(rb'\{"key": "([0-9a-f]{64})", "bytes": (\d+)[,}]')


def _parse_record(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
    except ValueError:
        return None  # torn by a crash while written: nothing to go by
    return record if isinstance(record, dict) else None


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
            private_dir(self.root)
            try:
                fd = os.open(self.root / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
            except FileExistsError:
                pass
            else:
                try:
                    _write_all(
                        fd,
                        b"turbotrain cache: entries are named by the SHA-256 of their URL. "
                        b"turbotrain.data.clear_cache(dir) removes only those entries.\n",
                    )
                finally:
                    os.close(fd)
        except UnsafeCacheDirError:
            raise
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
        """The entry's file (checked against its record: a wrong length is dropped, and None returned)."""
        path = self._entry(url)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return None
        return path if self._fits(url, path, size) else None

    def get(self, url: str) -> bytes | None:
        t0 = time.perf_counter()
        path = self._entry(url)
        try:
            f = open(path, "rb", buffering=0)
        except FileNotFoundError:
            return None
        with f:
            data = f.readall()
            fits = self._fits(url, f.fileno(), len(data))
        if not fits:
            return None
        stats.record(stats.CACHE_SCHEME, len(data), time.perf_counter() - t0)
        return data

    def _fits(self, url: str, where: str | int, size: int) -> bool:
        """Whether an entry of ``size`` bytes matches its record; one that does not is dropped (fetched again).

        An entry without a record (a filesystem that lost it, an older turbotrain) has nothing to be
        checked against and is kept; the listing check drops it when the dataset is built.
        """
        raw = self._raw_record(url, where)
        if raw is None:
            return True
        key = _key(url)
        head = _RECORD_HEAD.match(raw)  # every read passes here: the two fields without a JSON parse
        if head is not None:
            recorded_key, recorded_size = head[1].decode(), int(head[2])
        else:
            record = _parse_record(raw)
            if record is None:
                return True  # torn by a crash while written: nothing to go by
            if "key" not in record:
                self._drop(url)  # an older turbotrain's record, which kept the URL itself: fetched again without it
                return False
            recorded_key, recorded_size = record["key"], record.get("bytes", size)
        if recorded_key == key and recorded_size == size:
            return True
        log.warning(
            "turbotrain: the cached copy of %s is %d bytes where its record says %s; fetching it again",
            redact_url(url),
            size,
            f"{recorded_size} bytes" if recorded_key == key else "it holds another file",
        )
        self._drop(url)
        return False

    def _drop(self, url: str) -> None:
        for path in (self._entry(url), self.version_path(url)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def version_path(self, url: str) -> Path:
        return self.entry_path(url).with_suffix(_VERSION_SUFFIX)

    def _raw_record(self, url: str, where: str | int | None = None) -> bytes | None:
        """The record kept with ``url``'s entry (its xattr, or the ``.v`` file beside it); None when there is none.

        ``where`` is the entry's open descriptor or path when the caller has it.
        """
        try:
            return os.getxattr(self._entry(url) if where is None else where, _XATTR)
        except OSError:
            try:
                return self.version_path(url).read_bytes()
            except OSError:
                return None

    def recorded_version(self, url: str) -> Any:
        """The version recorded with ``url``'s entry (None when there is none)."""
        raw = self._raw_record(url)
        record = _parse_record(raw) if raw is not None else None
        # A record of an older turbotrain (it kept the URL itself) counts as none: the entry is fetched again.
        return record.get("version") if record is not None and record.get("key") == _key(url) else None

    def _record_version(self, fd: int, url: str, version: Any, size: int) -> None:
        # The URL's hash, never the URL: a signed query or user:password@ in it is not kept on disk.
        raw = json.dumps({"key": _key(url), "bytes": size, "version": version}).encode()
        try:
            os.setxattr(fd, _XATTR, raw)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.E2BIG):
                raise
        # No user xattrs here: a file beside the entry. A torn one (a crash while writing these
        # few bytes) reads as no version, and the entry is fetched again.
        side = os.open(self.version_path(url), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _FILE_MODE)
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
            self._drop(url)
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
                self._subdir(sub)
                self._made.add(name[:2])
            # A name no other writer (process or thread) uses, without mkstemp's cost per file.
            tmp = f"{sub}/{_TMP_PREFIX}{name[:16]}-{os.getpid()}-{threading.get_ident()}-{next(_seq)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
            try:
                _write_all(fd, data)
                # Before the rename, so the entry never appears without it: its length, and its version.
                self._record_version(fd, url, version, len(data))
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
                    f"{len(data) / 1e6:.1f} MB for {redact_url(url)}; no partial file was kept. Free space there, "
                    "point cache= at a larger disk, or use cache=None.",
                ) from exc
            raise
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    @staticmethod
    def _subdir(sub: str) -> None:
        try:
            os.mkdir(sub, _DIR_MODE)
        except FileExistsError:
            pass

    def _claim_path(self, url: str) -> str:
        sub, name = self._entry(url).rsplit("/", 1)
        return f"{sub}/{_TMP_PREFIX}claim-{name}"

    def claim(self, url: str) -> bool:
        """Take the job of fetching ``url`` for every process using this cache; False if another has it.

        The claim is a file created exclusively next to where the entry goes, holding its owner (host,
        boot id, pid namespace, pid and the process's start time). A claim whose process is gone (killed,
        the machine restarted, its pid now another process's) is taken over at once; one this machine
        cannot check (another host sharing the folder) only when older than ``STALE_TMP_S``. ``release``
        ends it. Claims only save duplicate downloads: entries appear whole by rename whoever writes them.
        """
        path = self._claim_path(url)
        self._subdir(path.rsplit("/", 1)[0])
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        except FileExistsError:
            if self._claim_alive(path):
                return False
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            return self.claim(url)
        try:
            _write_all(fd, json.dumps(_this_process()).encode())
        finally:
            os.close(fd)
        return True

    def _claim_alive(self, path: str) -> bool:
        """Whether the claim at ``path`` still stands (True while this machine cannot tell)."""
        try:
            age = time.time() - os.stat(path).st_mtime
        except FileNotFoundError:
            return False
        raw = _read_small(path)
        try:
            owner = json.loads(raw) if raw else None
        except ValueError:
            owner = None
        if not isinstance(owner, dict):
            return age < CLAIM_WRITE_S  # its owner died between creating and writing it, or is an older turbotrain
        gone = _owner_gone(owner)
        return age < STALE_TMP_S if gone is None else not gone

    def claimed(self, url: str) -> bool:
        """Whether another process is fetching ``url`` now (False once its process is gone)."""
        return self._claim_alive(self._claim_path(url))

    def release(self, url: str) -> None:
        """End this process's claim of ``url`` (a claim another process took over from it stays)."""
        path = self._claim_path(url)
        raw = _read_small(path)
        try:
            owner = json.loads(raw) if raw else None
        except ValueError:
            owner = None
        if isinstance(owner, dict) and owner != _this_process():
            return
        try:
            os.unlink(path)
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
    """This user's shared-memory cache folder: /dev/shm/turbotrain-cache-<uid>, unless another user took that name.

    The name is predictable, so another user can create it first to read and replace what would be
    cached there. Such a folder (not this user's, a link, or writable by others and not empty) is
    passed over with a warning for a private /dev/shm/turbotrain-cache-<uid>-<random>, made 0700;
    later runs find and share it, since only this user can own a folder of that name that passes the
    same checks. Nobody else can remove it from /dev/shm (sticky), so it stays this user's.
    """
    shm = Path(SHM_ROOT)
    if not shm.is_dir():
        raise OSError(f"cache='shm' needs {shm}, which this system lacks; pass a local directory instead")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    preferred = shm / f"turbotrain-cache-{uid}"
    spares = sorted(shm.glob(f"turbotrain-cache-{uid}-*"))
    for path in [preferred, *spares]:
        try:
            if path != preferred and not path.is_dir():
                continue
            if path.is_symlink():  # turbotrain never makes one here: someone else points it elsewhere
                raise UnsafeCacheDirError(f"{path} is a symbolic link, which turbotrain never makes")
            return private_dir(path, "shared-memory cache folder")
        except UnsafeCacheDirError as exc:
            log.warning("turbotrain: passing over %s: %s", path, exc)
        except FileNotFoundError:
            continue  # removed meanwhile
    return Path(tempfile.mkdtemp(prefix=f"turbotrain-cache-{uid}-", dir=shm))  # 0700, a name nobody had


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
