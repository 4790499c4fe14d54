"""Checkpoint files that are either complete or absent, and safe to load.

Commit protocol (the same idea as distributed checkpoint's metadata commit):

1. the state is serialised straight into ``.step-N.pt.tmp-<pid>`` (created exclusively, never
   through a link planted at that name), its SHA-256 computed on the way, fsync'ed, and renamed
   to ``step-N.pt``;
2. the manifest ``step-N.json`` (size and hash of that file, and of every file of the folders
   the state refers to, such as a sharded checkpoint's) is written the same way: *this* rename
   is the commit. A checkpoint without a manifest, or whose files do not match it, is not
   complete and is never picked up.

A checkpoint is data only: every file is hash-checked before anything is unpickled, loading
uses ``torch.load(weights_only=True)``, so a hostile pickle cannot run code, and only files
inside the checkpoint directory are read (no links). Every failure (missing, truncated, flipped
bits, foreign pickle) is a :class:`CheckpointError` naming the file. The directory must be the
user's own (:func:`own_directory`): whoever else can write there could plant a checkpoint.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import stat
from pathlib import Path
from typing import IO, Any, Callable, cast

import torch

from ..config import ConfigError
from .faults import fault_point

__all__ = [
    "CheckpointError",
    "CheckpointMismatchError",
    "own_directory",
    "save_checkpoint",
    "load_checkpoint",
    "list_checkpoints",
    "latest_checkpoint",
    "clean_temporary_files",
    "prune_checkpoints",
]

log = logging.getLogger("turbotrain")

_NAME = re.compile(r"^step-(\d{9})\.pt$")
_TMP = re.compile(r"^\.step-\d{9}\.(pt|json)\.tmp-\d+$")
_FOLDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a plain name inside the directory: no "/", "." or ".."
_FILE = re.compile(r"^(?!\.\.?$)[A-Za-z0-9._-]+$")
_CHUNK = 1 << 20
FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the file and why."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"checkpoint {self.path}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:  # processes pass it on (DCP gathers each one's error)
        return type(self), (self.path, self.reason)


class CheckpointMismatchError(CheckpointError, ConfigError):
    """A checkpoint that loads but does not fit this run (another model, optimizer or data loader).

    Not damage, so no older checkpoint is tried instead: the message says what differs. A
    ConfigError too, so the command line reports it without a traceback.
    """

    def __init__(self, path: str | os.PathLike, problems: list[str]):
        self.problems = problems
        super().__init__(
            path,
            "does not fit this run: "
            + "; ".join(problems)
            + ". It is intact (not damaged), so no older checkpoint is tried instead: resume with the model, "
            "optimizers, schedulers and data loader that wrote it, or point checkpoint_dir at another folder "
            "to start afresh.",
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.path, self.problems)


def own_directory(directory: str | os.PathLike, create: bool) -> Path:
    """``directory`` once it is checked to be the user's own: created 0700 (``create``), or an existing
    folder owned by this user and writable by nobody else. Whoever else can write there could plant
    a checkpoint (or a link at a temporary file's name) that a later resume would load."""
    path = Path(directory)
    if not str(directory):
        raise ConfigError("checkpoint_dir: an empty path is not allowed; name a folder (or leave it unset).")
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"checkpoint_dir {path}: cannot be created ({exc.strerror or exc}).") from None
    try:
        info = path.stat()
    except FileNotFoundError:
        return path  # nothing there yet: nothing to resume from
    except OSError as exc:
        raise ConfigError(f"checkpoint_dir {path}: cannot be read ({exc.strerror or exc}).") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"checkpoint_dir {path}: is not a folder.")
    uid = os.geteuid()
    if info.st_uid != uid:
        raise ConfigError(
            f"checkpoint_dir {path}: belongs to uid {info.st_uid}, not to you (uid {uid}); its owner could "
            "plant a checkpoint that your next resume loads. Use a folder of your own."
        )
    if info.st_mode & stat.S_IWOTH or (info.st_mode & stat.S_IWGRP and not _private_group(info.st_gid)):
        who = "everyone" if info.st_mode & stat.S_IWOTH else f"group {info.st_gid}"
        raise ConfigError(
            f"checkpoint_dir {path}: is writable by {who} (mode {stat.S_IMODE(info.st_mode):o}); anyone who can "
            f"write there could plant a checkpoint that your next resume loads. Run 'chmod go-w {path}' "
            "or use a folder of your own."
        )
    return path


def _private_group(gid: int) -> bool:
    """The user's own primary group with no other member (a user private group, as umask 002 systems make)."""
    import grp
    import pwd

    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == os.getegid() and group.gr_name == me and set(group.gr_mem) <= {me}


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Hashing:
    """A write-only file that hashes and counts what goes through it: no copy of the state in memory."""

    def __init__(self, fh: IO[bytes]):
        self.fh, self.sha256, self.size = fh, hashlib.sha256(), 0
        self.error: OSError | None = None  # torch.save turns a failed write into its own error type

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.size += len(data)
        try:
            return self.fh.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.fh.flush()


def _exclusive(path: str, flags: int) -> int:
    # O_EXCL | O_NOFOLLOW: a file or link planted at the predictable temporary name is never written through.
    return os.open(path, flags | os.O_EXCL | os.O_NOFOLLOW, 0o600)


def _unwritable(path: Path, exc: OSError) -> CheckpointError:
    return CheckpointError(
        path,
        f"could not be written ({exc.strerror or exc}); nothing was committed. "
        f"Free space in {path.parent} or point checkpoint_dir elsewhere.",
    )


def _atomic_write(path: Path, write: Callable[[_Hashing], Any]) -> tuple[int, str]:
    """``write(fh)`` into a fresh temporary file, fsync'ed and renamed to ``path``; its size and SHA-256."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        try:
            fh = open(tmp, "wb", opener=_exclusive)
        except FileExistsError:
            tmp.unlink()  # a dead writer's leftover, or a planted link: unlink removes the link, not its target
            fh = open(tmp, "wb", opener=_exclusive)
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    out = _Hashing(fh)
    try:
        with fh:
            write(out)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)  # a full disk (or a state that cannot be saved) leaves no half-written file
        failed = out.error or exc
        if isinstance(failed, OSError):
            raise _unwritable(path, failed) from exc
        raise
    return out.size, out.sha256.hexdigest()


def _hash_file(fh: IO[bytes]) -> str:
    sha256 = hashlib.sha256()
    while chunk := fh.read(_CHUNK):
        sha256.update(chunk)
    return sha256.hexdigest()


def _open_regular(path: Path) -> IO[bytes]:
    """``path`` opened for reading if it is a regular file itself (no link, FIFO or device: reading
    a FIFO would block for ever, /dev/zero would never end, a link leads outside the directory)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise CheckpointError(path, "is a symbolic link; a checkpoint reads only files inside its folder") from None
        raise CheckpointError(path, f"cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(path, "is not a regular file")
    return os.fdopen(fd, "rb")


def _verify(path: Path, fh: IO[bytes], expected_size: int, expected_hash: str) -> None:
    size = os.fstat(fh.fileno()).st_size
    if size != expected_size:
        raise CheckpointError(path, f"is {size} bytes but was committed with {expected_size}: truncated or overwritten")
    try:
        digest = _hash_file(fh)
    except OSError as exc:
        raise CheckpointError(path, f"cannot be read ({exc.strerror or exc})") from None
    if digest != expected_hash:
        raise CheckpointError(path, "its contents do not match the committed SHA-256: the file is corrupted")
    fh.seek(0)


def _hash_folder(folder: Path) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of every file of ``folder`` (a flat folder of regular files)."""
    files: dict[str, dict[str, Any]] = {}
    for name in sorted(os.listdir(folder)):
        if not _FILE.match(name):
            raise CheckpointError(folder / name, "has a name a checkpoint folder does not hold")
        with _open_regular(folder / name) as fh:
            files[name] = {"bytes": os.fstat(fh.fileno()).st_size, "sha256": _hash_file(fh)}
    return files


def _verify_folder(directory: Path, name: str, files: dict[str, dict[str, Any]]) -> None:
    """Every file of folder ``name`` matches the manifest, and it holds nothing else, before any is read."""
    folder = directory / name
    try:
        info = folder.lstat()
    except OSError as exc:
        raise CheckpointError(folder, f"cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise CheckpointError(folder, "is not a folder (a link, or a file); a checkpoint reads only its own folders")
    present = set(os.listdir(folder))
    if present != set(files):
        extra, lacking = sorted(present - set(files)), sorted(set(files) - present)
        raise CheckpointError(
            folder,
            "does not hold what its manifest lists"
            + (f"; not covered by it: {', '.join(extra)}" if extra else "")
            + (f"; missing: {', '.join(lacking)}" if lacking else ""),
        )
    for file, entry in files.items():
        with _open_regular(folder / file) as fh:
            _verify(folder / file, fh, entry["bytes"], entry["sha256"])


def load_error(exc: BaseException) -> str:
    """``torch.load``'s error in one line: for a refused pickle, the global it refused (not the advice to
    load it with ``weights_only=False``, which would run it)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    refused = [line for line in lines if "GLOBAL" in line or "Unsupported" in line]
    return f"{type(exc).__name__}: {(refused or lines or [''])[0]}"


def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / f"step-{step:09d}.pt"


def _manifest_path(path: Path) -> Path:
    return path.with_suffix(".json")


def save_checkpoint(
    state: dict[str, Any], directory: str | os.PathLike, step: int, folders: tuple[str, ...] = ()
) -> Path:
    """Write ``state`` as the checkpoint of ``step``; returns its path once committed.

    ``folders``: folders of ``directory`` that belong to this checkpoint (a sharded checkpoint's),
    complete already; every file in them is hashed into the manifest.
    """
    directory = own_directory(directory, create=True)
    path = checkpoint_path(directory, step)
    covered = {}
    for name in folders:
        if not _FOLDER.match(name):
            raise CheckpointError(directory / name, "is not a plain folder name inside the checkpoint directory")
        covered[name] = _hash_folder(directory / name)
    size, digest = _atomic_write(path, lambda fh: torch.save(state, cast(IO[bytes], fh)))  # it only writes
    fault_point("checkpoint-between-data-and-commit")
    manifest: dict[str, Any] = {"format": FORMAT, "step": step, "bytes": size, "sha256": digest}
    if covered:
        manifest["folders"] = covered
    _atomic_write(_manifest_path(path), lambda fh: fh.write(json.dumps(manifest).encode()))
    _fsync_dir(directory)
    return path


def _read_manifest(path: Path) -> tuple[int, str, dict[str, dict[str, dict[str, Any]]]]:
    """The committed size and SHA-256 of ``path``, and the files of its folders, from its manifest."""
    manifest_path = _manifest_path(path)
    try:
        manifest = json.loads(manifest_path.read_text())
        folders = manifest.get("folders") or {}
        for name, files in folders.items():
            if not _FOLDER.match(name) or not all(_FILE.match(f) for f in files):
                raise ValueError(f"{name!r} is not a plain name of a folder inside the checkpoint directory")
            folders[name] = {f: {"bytes": int(e["bytes"]), "sha256": str(e["sha256"])} for f, e in files.items()}
        return int(manifest["bytes"]), str(manifest["sha256"]), folders
    except FileNotFoundError:
        raise CheckpointError(
            path, f"has no manifest {manifest_path.name}: it was never committed (the writer stopped before finishing)"
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError, OSError, OverflowError, RecursionError) as exc:
        # OverflowError: a size of 1e400; RecursionError: JSON nested deeper than the parser's stack.
        raise CheckpointError(path, f"its manifest {manifest_path.name} is unreadable ({exc})") from None


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a committed checkpoint, verifying it and its folders against its manifest. Never runs pickled code."""
    path = Path(path)
    expected_size, expected_hash, folders = _read_manifest(path)
    with _open_regular(path) as fh:
        _verify(path, fh, expected_size, expected_hash)
        for name, files in folders.items():  # every file hash-checked before anything is unpickled
            _verify_folder(path.parent, name, files)
        try:
            # From the file checked just now (not a copy of its bytes: the state is in memory once).
            state = torch.load(fh, map_location=map_location, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - the unpickler raises many types; one error type out
            raise CheckpointError(path, f"is not a loadable turbotrain checkpoint ({load_error(exc)})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(path, "is not a turbotrain checkpoint (missing or unknown format marker)")
    sharded = state.get("sharded")
    if sharded is not None and sharded not in folders:
        raise CheckpointError(
            path, f"refers to the sharded folder {sharded!r}, which its manifest does not cover; it is never read"
        )
    return state


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Committed-looking checkpoint files, oldest first (completeness is checked on load)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, falling back past incomplete or corrupted ones.

    None when no checkpoint was committed; a CheckpointError naming each one when some were
    but none loads (starting afresh beside them would hide the damage).
    """
    refused = []
    for path in reversed(list_checkpoints(directory)):
        try:
            return path, load_checkpoint(path)
        except CheckpointError as exc:
            log.warning("turbotrain: skipping %s", exc)
            if _manifest_path(path).exists():
                refused.append(exc)
    if refused:
        raise CheckpointError(
            directory,
            f"none of its {len(refused)} committed checkpoint(s) can be used: "
            + "; ".join(str(exc) for exc in refused)
            + ". Move them away to start from scratch, or resume from a copy you trust.",
        )
    return None


def clean_temporary_files(directory: str | os.PathLike) -> list[Path]:
    """Remove what a killed writer left behind: temporary files and data never committed.

    Only turbotrain's own file names are touched; nothing else in the directory is deleted.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for p in directory.iterdir():
        uncommitted = _NAME.match(p.name) and not _manifest_path(p).exists()
        if _TMP.match(p.name) or uncommitted:
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def prune_checkpoints(directory: str | os.PathLike, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints (0 or less keeps all)."""
    if keep <= 0:
        return
    for path in list_checkpoints(directory)[:-keep]:
        _manifest_path(path).unlink(missing_ok=True)  # un-commit first, then remove the data
        path.unlink(missing_ok=True)
