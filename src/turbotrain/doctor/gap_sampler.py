"""Which user line runs while no hook is timing anything before the step's forward.

That untimed time is charged to data loading (a generator or indexing building the next batch);
the samples say which line it is. One look at the script thread's stack every few milliseconds,
during the measured steps only, and only for a gap worth a finding.

A short run with short gaps (six steps with 8 ms of batch building each) holds only a few 10 ms
ticks of gap: the sampler then looks more often, aiming at about ``TARGET_SAMPLES`` looks inside
the gaps, so that one late wake-up of this thread cannot leave the finding without its line.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from .sites import user_site

__all__ = ["GapSampler", "sampling_interval"]

TARGET_SAMPLES = 20
MAX_INTERVAL_S = 10e-3
# Finer than this, the sampler's own GIL traffic would show in the steps it samples.
MIN_INTERVAL_S = 1e-3


def sampling_interval(gap_s: float, measured_steps: int | None) -> float:
    """Seconds between looks so that the gaps of ``measured_steps`` steps hold about TARGET_SAMPLES."""
    if not measured_steps:
        return MAX_INTERVAL_S  # the run goes on until the script ends: plenty of ticks
    return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, gap_s * measured_steps / TARGET_SAMPLES))


class GapSampler(threading.Thread):
    """Counts ``recorder.gap_samples[site]`` while the recorder's open step is in its untimed gap."""

    def __init__(self, recorder: Any, interval_s: float = MAX_INTERVAL_S) -> None:
        super().__init__(name="turbotrain-doctor-sampler", daemon=True)
        self.recorder, self.interval_s = recorder, interval_s
        self._done = threading.Event()

    def run(self) -> None:
        rec = self.recorder
        while not self._done.wait(self.interval_s):
            opened = rec.open_step
            if self.busy(rec, opened):
                continue  # a phase is timing this moment, the forward already started, or still warming up
            site = user_site(sys._current_frames().get(rec.thread))
            # The script thread may have run on between the test and the frame read (this thread can lose
            # the GIL in between): the line counts only if the same step is still in its untimed gap.
            if site is not None and not self.busy(rec, opened):
                rec.gap_samples[site] += 1

    @staticmethod
    def busy(rec: Any, opened: Any) -> bool:
        return bool(rec.stack or opened.marks or len(rec.steps) < rec.warmup or rec.open_step is not opened)

    def stop(self) -> None:
        self._done.set()
