"""Preemption: SIGTERM asks for a checkpoint at the next step boundary, then a clean exit.

Schedulers (Slurm, Kubernetes, spot instances) send SIGTERM and wait a grace period before
SIGKILL. The handler only sets a flag; the Trainer finishes the step it is in, saves a
checkpoint (when it has a checkpoint_dir), and raises :class:`Preempted`, a ``SystemExit``
with code 143 (128 + SIGTERM), so a script that does not catch it exits with that code and
no traceback, and ``fit(resume=True)`` continues exactly where it stopped.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["PREEMPTED_EXIT_CODE", "Preempted", "SignalWatch"]

PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM


class Preempted(SystemExit):
    def __init__(self, step: int, checkpoint: str | None):
        self.step = step
        self.checkpoint = checkpoint
        super().__init__(PREEMPTED_EXIT_CODE)

    def __str__(self) -> str:
        saved = f"checkpoint {self.checkpoint}" if self.checkpoint else "no checkpoint_dir, nothing saved"
        return f"preempted by SIGTERM at step {self.step} ({saved})"


class SignalWatch:
    """Within the block, SIGTERM sets ``requested`` instead of killing the process."""

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)) -> None:
        self.signals = signals
        self.requested = False
        self._previous: dict = {}

    def _handler(self, signum, frame) -> None:
        self.requested = True

    def __enter__(self) -> "SignalWatch":
        # Signal handlers can only be installed from the main thread; elsewhere, leave them be.
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
