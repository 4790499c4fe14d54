"""On CUDA: device time per phase from CUDA events (read once they completed, no sync), and every
synchronizing call tied to the user's line through ``torch.cuda.set_sync_debug_mode("warn")``."""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from collections import defaultdict
from typing import Any, Callable

import torch

from .measurements import Phase

__all__ = ["GpuTimer"]

_SYNC_WARNING = re.compile(r"called a synchronizing CUDA operation")


class GpuTimer:
    def __init__(self) -> None:
        self.phase_seconds: dict[int, dict[Phase, float]] = {}  # step -> phase -> device seconds
        self._events: list[tuple[int, Phase, Any, Any]] = []
        self._open: list[tuple[Phase, Any]] = []
        self._saved_sync_mode: Any = None
        self._warning_filter: tuple | None = None

    def mark(self, phase: Phase, start: bool, step: int) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        if start:
            self._open.append((phase, event))
        elif self._open:
            phase, begin = self._open.pop()
            self._events.append((step, phase, begin, event))

    def resolve(self, block: bool) -> None:
        """Add the completed events' seconds to ``phase_seconds`` (all of them with ``block``)."""
        pending = []
        for step, phase, begin, end in self._events:
            if block:
                end.synchronize()
            elif not end.query():
                pending.append((step, phase, begin, end))
                continue
            per = self.phase_seconds.setdefault(step, defaultdict(float))
            per[phase] += begin.elapsed_time(end) / 1000.0
        self._events = pending

    def install_sync_debug(self, patcher: Any, on_sync: Callable[[Any], None]) -> None:
        """Warn on every synchronizing CUDA call and hand its frame to ``on_sync`` instead of printing."""
        self._saved_sync_mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        warnings.filterwarnings("always", message=".*called a synchronizing CUDA operation.*")
        self._warning_filter = warnings.filters[0]
        original = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if _SYNC_WARNING.search(str(message)):
                on_sync(sys._getframe(1))
                return
            original(message, category, filename, lineno, file, line)

        patcher.replace(warnings, "showwarning", lambda _: showwarning)

    def remove_sync_debug(self) -> None:
        torch.cuda.set_sync_debug_mode(self._saved_sync_mode or 0)
        with contextlib.suppress(ValueError):
            warnings.filters.remove(self._warning_filter)  # type: ignore[attr-defined]  # a list at run time
