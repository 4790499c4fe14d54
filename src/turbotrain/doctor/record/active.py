"""The recording in progress in this process (at most one), read by every wrapper on its hot path.

Its own module so that the wrappers (:mod:`turbotrain.doctor.record.instrument`) and the recorder that
installs them (:mod:`turbotrain.doctor.record.recorder`) both read it without importing each other.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

__all__ = ["current", "get", "compiling", "perf_counter"]

current: Any = None  # the active Recorder, or None
perf_counter = time.perf_counter

try:
    compiling = torch.compiler.is_compiling
except AttributeError:  # pragma: no cover - older torch: never compiling through us

    def compiling() -> bool:
        return False


def get() -> Any:
    return current


def _forget_in_child() -> None:
    global current
    current = None  # DataLoader workers and other forks record nothing


os.register_at_fork(after_in_child=_forget_in_child)
