"""The profiler window: torch.profiler over a few steps after the measured ones (op table, trace).

Each step of the window gets a ``turbotrain/step#N`` range; the recorder opens a
``turbotrain/<phase>`` range per phase while ``profiling`` is on (NVTX too on CUDA).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

__all__ = ["ProfilerWindow"]

log = logging.getLogger("turbotrain")


class ProfilerWindow:
    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        self.profiler: Any = None      # torch.profiler.profile once the window ran
        self.nvtx = False              # phases also push NVTX ranges (CUDA, while profiling)
        self._step_range: Any = None

    def start(self, index: int) -> bool:
        """Start profiling at step ``index``; False (and a warning) when the profiler cannot start."""
        from torch.profiler import ProfilerActivity, profile

        # kineto prints "USDT: ... profiler_start/stop" banners on stderr at its highest level (5) in
        # torch 2.13, so only 6 silences them; read when the first profiler starts, a user's value wins.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.gpu else [])
        try:
            self.profiler = profile(activities=activities, record_shapes=False, with_stack=False)
            self.profiler.__enter__()
        except Exception as exc:  # noqa: BLE001 - a profiler that cannot start costs the trace, not the run
            log.warning("turbotrain doctor: torch.profiler did not start (%s); no trace or op table", exc)
            self.profiler = None
            return False
        self.nvtx = self.gpu
        self.open_step_range(index)
        return True

    def open_step_range(self, index: int) -> None:
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
        self._step_range = torch.autograd.profiler.record_function(f"turbotrain/step#{index}")
        self._step_range.__enter__()

    def stop(self, stack: list[list]) -> None:
        """End the window; the phase ranges still open on ``stack`` end with it."""
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        for entry in stack:
            if entry[2] is not None:
                entry[2].__exit__(None, None, None)
                entry[2] = None
        try:
            self.profiler.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001
            log.warning("turbotrain doctor: torch.profiler failed to stop (%s)", exc)
            self.profiler = None
