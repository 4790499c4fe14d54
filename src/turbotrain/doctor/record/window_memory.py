"""The memory peak over the measured steps of a whole run, for ``doctor --verify`` to set beside the time.

On a GPU: the caching allocator's peak of allocated bytes, its counter reset when the window opens. On the CPU no
allocator counts: the process's resident peak (``VmHWM``), which Linux resets on writing ``5`` to
``/proc/self/clear_refs``. The resident figure holds what the window's steps touched, freed memory malloc has not
returned included, so it is set beside its value at the window's start; a fix that frees a step's tensors lowers
both sides' figures alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

__all__ = ["WindowMemory", "PeakProbe", "RESIDENT", "CUDA_ALLOCATED", "status_kib"]

Kind = Literal["process resident", "CUDA allocated"]
RESIDENT: Kind = "process resident"
CUDA_ALLOCATED: Kind = "CUDA allocated"

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass(frozen=True)
class WindowMemory:
    """What the process held when the window opened and at its peak over the window's steps, in bytes."""

    kind: Kind
    start_bytes: int
    peak_bytes: int

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "start_bytes": self.start_bytes, "peak_bytes": self.peak_bytes}


def status_kib(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (VmHWM, VmData), None where it cannot be read."""
    try:
        found = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) if found else None


class PeakProbe:
    """``start()`` when the window opens, ``stop()`` when it closes; None where the device gives no peak (not
    Linux, a /proc that refuses the reset)."""

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        self._start: int | None = None

    def start(self) -> None:
        if self.gpu:
            # The allocator counts on the host, as ops are queued: no sync needed (none added to a step).
            torch.cuda.reset_peak_memory_stats()
            self._start = torch.cuda.memory_allocated()
            return
        try:
            _CLEAR_REFS.write_text("5")  # the resident peak restarts at the resident size now
        except OSError:
            return
        start = status_kib("VmHWM")  # the reset counter itself: the resident size at the reset
        self._start = start * 1024 if start is not None else None

    def stop(self) -> WindowMemory | None:
        if self._start is None:
            return None
        if self.gpu:
            return WindowMemory(CUDA_ALLOCATED, self._start, torch.cuda.max_memory_allocated())
        peak = status_kib("VmHWM")
        # The window's peak is at least what it opened with: the kernel's counters are batched per CPU, and VmHWM
        # read at the end fell 150 KB under the start read just after its reset once (a run whose RSS then shrank).
        return WindowMemory(RESIDENT, self._start, max(peak * 1024, self._start)) if peak is not None else None
