"""Checkpoint files that are either complete or absent, and safe to load.

Commit protocol (the same idea as distributed checkpoint's metadata commit):

1. the state is serialised in memory and its SHA-256 computed;
2. the bytes go to ``.step-N.pt.tmp-<pid>``, are fsync'ed, and renamed to ``step-N.pt``;
3. the manifest ``step-N.json`` (size and hash) is written the same way: *this* rename is
   the commit. A checkpoint without a manifest, or whose bytes do not match it, is not
   complete and is never picked up.

Loading uses ``torch.load(weights_only=True)``, so a hostile pickle cannot run code; every
failure (missing, truncated, flipped bits, foreign pickle) is a :class:`CheckpointError`
naming the file.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import stat
from pathlib import Path
from typing import Any

import torch

from .faults import fault_point

__all__ = [
    "CheckpointError",
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
FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the file and why."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"checkpoint {self.path}: {reason}")


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


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # a full disk must not leave a half-written file behind
        raise CheckpointError(
            path,
            f"could not be written ({exc.strerror or exc}); nothing was committed. "
            f"Free space in {path.parent} or point checkpoint_dir elsewhere.",
        ) from exc


def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / f"step-{step:09d}.pt"


def _manifest_path(path: Path) -> Path:
    return path.with_suffix(".json")


def save_checkpoint(state: dict[str, Any], directory: str | os.PathLike, step: int) -> Path:
    """Write ``state`` as the checkpoint of ``step``; returns its path once committed."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(directory, step)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    _atomic_write(path, data)
    fault_point("checkpoint-between-data-and-commit")
    manifest = {"format": FORMAT, "step": step, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _atomic_write(_manifest_path(path), json.dumps(manifest).encode())
    _fsync_dir(directory)
    return path


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a committed checkpoint, verifying it against its manifest. Never runs pickled code."""
    path = Path(path)
    manifest_path = _manifest_path(path)
    try:
        manifest = json.loads(manifest_path.read_text())
        expected_size, expected_hash = int(manifest["bytes"]), str(manifest["sha256"])
    except FileNotFoundError:
        raise CheckpointError(
            path, f"has no manifest {manifest_path.name}: it was never committed (the writer stopped before finishing)"
        ) from None
    except (ValueError, KeyError, TypeError, OSError, OverflowError, RecursionError) as exc:
        # OverflowError: a size of 1e400; RecursionError: JSON nested deeper than the parser's stack.
        raise CheckpointError(path, f"its manifest {manifest_path.name} is unreadable ({exc})") from None
    try:
        # Check before reading: a FIFO would block for ever and /dev/zero would never end.
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(path, "is not a regular file")
        if info.st_size != expected_size:
            raise CheckpointError(
                path, f"is {info.st_size} bytes but was committed with {expected_size}: truncated or overwritten"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(path, f"cannot be read ({exc.strerror or exc})") from None
    if hashlib.sha256(data).hexdigest() != expected_hash:
        raise CheckpointError(path, "its contents do not match the committed SHA-256: the file is corrupted")
    try:
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - the unpickler raises many types; one error type out
        raise CheckpointError(
            path,
            f"is not a loadable turbotrain checkpoint ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})",
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(path, "is not a turbotrain checkpoint (missing or unknown format marker)")
    return state


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Committed-looking checkpoint files, oldest first (completeness is checked on load)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, falling back past incomplete or corrupted ones."""
    for path in reversed(list_checkpoints(directory)):
        try:
            return path, load_checkpoint(path)
        except CheckpointError as exc:
            log.warning("turbotrain: skipping %s", exc)
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
