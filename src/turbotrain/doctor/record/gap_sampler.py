"""Which user line runs while no hook is timing anything before the step's forward.

That untimed time is charged to data loading (a generator or indexing building the next batch);
the samples say which line it is. One look at the script thread's stack every few milliseconds,
during the measured steps only, and only for a gap worth a finding.

A short run with short gaps (six steps with 8 ms of batch building each) holds only a few 10 ms
ticks of gap: the sampler then looks more often, aiming at about ``TARGET_SAMPLES`` looks inside
the gaps, so that one late wake-up of this thread cannot leave the finding without its line. The
interval follows the measured steps' gaps as they complete: the step that starts the sampler is the
last warm-up step, whose gap can be ten times the others' (103 ms against 8.8 ms in a GAN script).

For each file a line was sampled in, the module's globals (the dict itself, never a frame's locals) are kept:
the batch-building what-if reads the script's own data from them.
"""

from __future__ import annotations

import statistics
import sys
import threading
from collections import Counter
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..sites import Site, user_site

if TYPE_CHECKING:
    from .open_step import OpenStep
    from .steps import StepTracker

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
    """Counts ``samples[site]`` while the open step of ``steps`` is in its untimed gap (after warm-up)."""

    def __init__(
        self,
        steps: StepTracker,
        samples: Counter[Site],
        warmup: int,
        interval_s: float = MAX_INTERVAL_S,
        measured_steps: int | None = None,
    ) -> None:
        super().__init__(name="turbotrain-doctor-sampler", daemon=True)
        self.steps, self.samples, self.warmup, self.interval_s = steps, samples, warmup, interval_s
        self.measured_steps = measured_steps
        self._sized_at = len(steps.steps)  # steps completed when the interval was last sized
        self._done = threading.Event()
        self.namespaces: dict[str, dict[str, Any]] = {}  # file -> its module's globals, for sampled files

    def run(self) -> None:
        steps = self.steps
        while not self._done.wait(self.interval_s):
            if len(steps.steps) != self._sized_at:
                self.resize()
            opened = steps.open_step
            if self.busy(opened):
                continue  # a phase is timing this moment, the forward already started, or still warming up
            frame = sys._current_frames().get(steps.thread)
            site = user_site(frame)
            # The script thread may have run on between the test and the frame read (this thread can lose
            # the GIL in between): the line counts only if the same step is still in its untimed gap.
            if site is not None and not self.busy(opened):
                self.samples[site] += 1
                if site.file not in self.namespaces:
                    found = _globals_of(frame, site.file)
                    if found is not None:
                        self.namespaces[site.file] = found

    def resize(self) -> None:
        """The interval from the median gap of the measured steps completed so far (warm-up steps left out)."""
        done = self.steps.steps
        self._sized_at = len(done)
        gaps = [record.gap_before_forward for record in done[self.warmup :]]
        if gaps:
            self.interval_s = sampling_interval(statistics.median(gaps), self.measured_steps)

    def busy(self, opened: OpenStep) -> bool:
        steps = self.steps
        return bool(
            steps.clock.frames or opened.marks or len(steps.steps) < self.warmup or steps.open_step is not opened
        )

    def stop(self) -> None:
        self._done.set()


def _globals_of(frame: FrameType | None, filename: str) -> dict[str, Any] | None:
    """The globals of the innermost frame running code of ``filename``."""
    while frame is not None:
        if frame.f_code.co_filename == filename:
            return frame.f_globals
        frame = frame.f_back
    return None
