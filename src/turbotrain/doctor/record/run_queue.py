"""How long a step waited for a CPU that another process held (Linux ``/proc/thread-self/schedstat``).

The kernel counts, per thread, the time it was ready to run while another process had the core.
Read per step, it tells machine noise from the script's own time.
"""

from __future__ import annotations

import os

__all__ = ["RunQueue"]


class RunQueue:
    """The run-queue wait of the thread that calls :meth:`open` (the script's main thread)."""

    # Reading the counter costs microseconds: a step that did not run long (over 1.5x the fastest of
    # the last few) is not read, and lost nothing worth taking out.
    LONG_STEP = 1.5
    RECENT = 8
    REFRESH_EVERY = 64  # steps between refreshes of the baseline, charging nobody

    def __init__(self) -> None:
        self._fd: int | None = None
        self._last_wait = 0
        self._since_read = 0
        self._recent: list[float] = []

    def open(self) -> None:
        try:
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None
        self._last_wait = self.wait_ns()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def wait_ns(self) -> int:
        """Nanoseconds this thread has waited for a CPU so far (0 where the kernel does not say)."""
        if self._fd is None:
            return 0
        try:
            return int(os.pread(self._fd, 64, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    def preempted(self, duration: float) -> float | None:
        """Seconds of a step of ``duration`` spent waiting for a CPU (None: the kernel does not say)."""
        if self._fd is None:
            return None
        recent = self._recent
        recent.append(duration)
        if len(recent) > self.RECENT:
            del recent[0]
        self._since_read += 1
        if len(recent) > 1 and duration <= self.LONG_STEP * min(recent) + 2e-4:
            if self._since_read >= self.REFRESH_EVERY:
                self._last_wait, self._since_read = self.wait_ns(), 0
            return 0.0
        now = self.wait_ns()
        waited = max(0, now - self._last_wait) / 1e9
        self._last_wait, self._since_read = now, 0
        return min(waited, duration)
