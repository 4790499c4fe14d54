"""Tuning results cached per model signature, input shape and hardware: a second call is instant.

The key hashes what decides the answer and nothing that does not: the model's structure
(class, module tree, parameter and buffer shapes and dtypes, not their values), the
shapes and dtypes of a batch, the optimizer's class and settings, the loss function, the
machine (device, cores, memory, torch version) and the tuning options. Entries are JSON
files under ``$TURBOTRAIN_CACHE/tune`` (default ``~/.cache/turbotrain/tune``), written
atomically so two processes tuning at once never read half a file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ..data.transfer import tensors_in
from ..hardware import Hardware

__all__ = ["cache_dir", "cache_key", "load", "store", "model_signature", "batch_signature"]

log = logging.getLogger("turbotrain")


def cache_dir() -> Path:
    root = os.environ.get("TURBOTRAIN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "turbotrain")
    return Path(root) / "tune"


def model_signature(model: nn.Module) -> list[Any]:
    """The model's structure without its values: the same architecture tunes the same way."""
    tensors = [
        (name, tuple(t.shape), str(t.dtype), bool(t.requires_grad))
        for name, t in [*model.named_parameters(), *model.named_buffers()]
    ]
    return [f"{type(model).__module__}.{type(model).__qualname__}", repr(model), tensors]


def batch_signature(batch: Any) -> list[Any]:
    return [(tuple(t.shape), str(t.dtype)) for t in tensors_in(batch)]


def _optimizer_signature(optimizer_fn: Callable) -> list[Any]:
    try:
        opt = optimizer_fn([nn.Parameter(torch.zeros(1))])
    except Exception as exc:  # noqa: BLE001 - an optimizer that needs real parameters: key on the callable
        return [getattr(optimizer_fn, "__qualname__", repr(optimizer_fn)), type(exc).__name__]
    return [type(opt).__qualname__, sorted((k, repr(v)) for k, v in opt.defaults.items())]


def function_name(fn: Any) -> str | None:
    """``module.qualname`` of a function (what a cache key records of it); None for None."""
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def cache_key(
    model: nn.Module, batch: Any, optimizer_fn: Callable, loss_fn: Any, hw: Hardware, options: dict[str, Any]
) -> str:
    parts = {
        "model": model_signature(model),
        "batch": batch_signature(batch),
        "optimizer": _optimizer_signature(optimizer_fn),
        "loss": function_name(loss_fn),
        "hardware": [
            hw.device_type,
            hw.device_name,
            hw.device_count,
            hw.cpu_cores,
            hw.intra_op_threads,
            round(hw.memory_bytes / 2**30),
            hw.capability,
            torch.__version__,
        ],
        "options": options,
    }
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _private_folder() -> Path:
    """The tune cache's folder, 0700 and this user's (another user's folder is refused: it could hold a
    planted plan)."""
    from ..data.cache import private_dir

    return private_dir(cache_dir(), "tune cache directory")


def load(key: str) -> dict[str, Any] | None:
    path = cache_dir() / f"{key}.json"
    try:
        if not path.exists():
            return None
        entry = json.loads((_private_folder() / path.name).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # UnsafeCacheDirError is a PermissionError: an OSError
        log.warning("turbotrain: ignoring unreadable tune cache entry %s (%s); tuning again", path, exc)
        return None
    if not isinstance(entry, dict):
        log.warning("turbotrain: ignoring tune cache entry %s (not a JSON object); tuning again", path)
        return None
    return entry


def store(key: str, entry: dict[str, Any]) -> Path | None:
    folder = cache_dir()
    try:
        folder = _private_folder()
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(entry, fh, indent=1, default=repr)
        path = folder / f"{key}.json"
        os.replace(tmp, path)
        return path
    except OSError as exc:
        log.warning(
            "turbotrain: could not write the tune cache under %s (%s); set TURBOTRAIN_CACHE to a "
            "writable folder to make the next call instant",
            folder,
            exc,
        )
        return None
