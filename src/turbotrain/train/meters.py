"""What a fit() measures as it runs, without waiting on the device each step: the mean training
loss of a logging window and the steady-state throughput."""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["LossMeter", "ThroughputClock"]


class LossMeter:
    """Mean training loss over a logging window, kept where reading it is free.

    On the host, step losses arrive as floats (reading a CPU tensor waits for nothing); on a
    GPU they stay device tensors, kept as they are (no kernel per step) and summed when the
    window is read, once.
    """

    FOLD = 512  # device losses held before they are summed into one (a long window holds few tensors)

    def __init__(self, device: torch.device):
        self.on_host = device.type != "cuda"
        self.total: Any = 0.0
        self.pending: list[torch.Tensor] = []
        self.count = 0
        self.hold = True  # False: a device loss is summed as it comes (it may not outlive its step)

    def add(self, loss: Any) -> None:
        if self.on_host:
            self.total += loss
        elif self.hold:
            self.pending.append(loss)
            if len(self.pending) >= self.FOLD:
                self._fold()
        else:
            self.total = self.total + loss.float()
        self.count += 1

    def _fold(self) -> None:
        self.total = self.total + torch.stack(self.pending).float().sum()
        self.pending = []

    def pop_mean(self) -> float | None:
        if not self.count:
            return None
        if not self.on_host:
            if self.pending:
                self._fold()
            self.total = float(self.total)  # the window's one sync
        mean = self.total / self.count
        self.total, self.count = 0.0, 0
        return mean


class ThroughputClock:
    """Steady-state throughput: from the end of the warm-up steps, minus validation and checkpoints."""

    def __init__(self, device: torch.device, warmup_steps: int, start_step: int, start_samples: int):
        self.cuda = device.type == "cuda"
        self.warmup_until = start_step + warmup_steps
        self.t0: float | None = None
        self.samples0 = start_samples
        self.excluded = 0.0
        if warmup_steps == 0:
            self.t0 = time.perf_counter()

    @property
    def warming_up(self) -> bool:
        return self.t0 is None

    def at_step(self, step: int, samples: int) -> None:
        """Called at step events; starts the clock once the warm-up steps are done."""
        if step >= self.warmup_until and self.t0 is None:
            if self.cuda:
                torch.cuda.synchronize()  # once: the warm-up's queued work must not count
            self.t0, self.samples0, self.excluded = time.perf_counter(), samples, 0.0

    def exclude(self, seconds: float) -> None:
        if self.t0 is not None:
            self.excluded += seconds

    def rate(self, samples: int) -> float | None:
        """Samples per second since the warm-up ended, given the samples seen so far."""
        if self.t0 is None or samples == self.samples0:
            return None
        if self.cuda:
            torch.cuda.synchronize()  # only at the logging cadence
        elapsed = time.perf_counter() - self.t0 - self.excluded
        return (samples - self.samples0) / elapsed if elapsed > 0 else None
