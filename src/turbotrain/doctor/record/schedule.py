"""Which steps of a recording are warm-up, measured and profiled, and after which the script ends.

A window holding a single occurrence of periodic work (validation every N steps) is extended, one
step at a time, until the second occurrence shows its period, within bounds. Work at a period far longer
than the window (an evaluation every 300 steps) is found after it: where the running loop has such a
cadence, the script is not ended with the window but its step clock is watched on (:mod:`.watch`) for up to
``watch_s`` seconds.

Where steps are long (a 30-s step of gradient accumulation), a window of ``measure`` steps would keep the user
waiting many minutes for statistics a few such steps already give: with ``record_s`` the window is cut, when it
opens, to the steps that fit in that many seconds (at least :attr:`StepSchedule.MIN_STEPS`), and one profiled step.
"""

from __future__ import annotations

import statistics
import time

from .measurements import StepRecord
from .recurring import find_periodic

__all__ = ["StepSchedule"]


class StepSchedule:
    """``warmup`` steps (not measured), ``measure`` steps, then ``profile`` steps under torch.profiler.

    With ``stop`` the script is ended after the last of them; with ``measure=None`` there is no end in
    sight, and the profiler window comes right after warm-up.
    """

    MAX_EXTENSION_FACTOR = 4
    MAX_EXTENSION_S = 60.0
    # Seconds the step clock may be watched after the window (0: the script ends with the window).
    WATCH_S = 20.0
    MIN_STEPS = 5  # the fewest steps a window is cut to for long steps

    def __init__(
        self,
        measure: int | None,
        warmup: int,
        profile: int,
        stop: bool,
        watch_s: float = WATCH_S,
        record_s: float | None = None,
    ) -> None:
        if warmup < 1:
            raise ValueError("warmup must be >= 1: the first step also holds the script's setup time")
        self.measure, self.warmup, self.profile_steps = measure, warmup, profile
        self.asked = measure
        self.profile_at = warmup if measure is None else warmup + measure
        self.stop_after = warmup + measure + profile if stop and measure is not None else None
        self._extension_started: float | None = None
        self.warmup_extended_by = 0  # steps added to drain a DataLoader's prefetched batches
        self.extends_for_period = True  # False: exactly ``measure`` steps (both sides of a comparison)
        self.watch_s = watch_s
        self.record_s = record_s
        self.cut_for_step_s: float | None = None  # the typical warm-up step, where the window was cut for it

    @property
    def watches(self) -> bool:
        """Whether the step clock may be watched after the window (never where the window is exact)."""
        return self.watch_s > 0 and self.extends_for_period and self.stop_after is not None

    def extend_warmup(self, steps: int) -> None:
        """``steps`` more warm-up steps (once): everything after warm-up moves back by as many."""
        if self.warmup_extended_by or steps <= 0:
            return
        self.warmup_extended_by = steps
        self.warmup += steps
        self.profile_at += steps
        if self.stop_after is not None:
            self.stop_after += steps

    def one_more_warmup_step(self) -> None:
        """One more warm-up step, not counted as an extension (which may still follow): everything after warm-up
        moves back by one."""
        self.warmup += 1
        self.profile_at += 1
        if self.stop_after is not None:
            self.stop_after += 1

    def drain_more(self, steps: int) -> None:
        """``steps`` more warm-up steps after the extension, for batches the workers still held ready."""
        self.warmup_extended_by += steps
        self.warmup += steps
        self.profile_at += steps
        if self.stop_after is not None:
            self.stop_after += steps

    def fit_window(self, steps: list[StepRecord]) -> None:
        """As the window opens: fewer measured steps where ``measure`` of the warm-up's steps would take more than
        ``record_s`` (the first step, which holds the script's set-up, is not read)."""
        if self.record_s is None or self.measure is None or self.cut_for_step_s is not None or len(steps) < 2:
            return
        # The fastest after the set-up step: one slow warm-up step (a compile, a collection) is no long step.
        step_s = min(s.duration for s in steps[1:])
        if step_s * self.measure <= self.record_s:
            return
        fits = max(self.MIN_STEPS, int(self.record_s / step_s))
        if fits >= self.measure:
            return
        self.cut_for_step_s = step_s
        if self.stop_after is not None:
            self.stop_after -= self.measure - fits
        self.profile_at -= self.measure - fits
        self.measure = fits
        if self.profile_steps > 1:
            self.cut_profile(1)

    def cut_profile(self, steps: int) -> None:
        """Profile ``steps`` steps (fewer than asked: each would take too many events); the script ends as much
        sooner."""
        if self.stop_after is not None:
            self.stop_after -= self.profile_steps - steps
        self.profile_steps = steps

    @property
    def measured_end(self) -> int | None:
        """The number of steps done when the measured window ends (None: it does not)."""
        return None if self.measure is None else self.warmup + self.measure

    def extend_for_period(self, steps: list[StepRecord]) -> bool:
        """At the window's end: one more step when periodic work was seen once and its period is unknown."""

        if self.measure is None or self.asked is None or not self.extends_for_period:
            return False
        if self._extension_started is None:
            self._extension_started = time.perf_counter()
        if (
            self.measure - self.asked >= self.MAX_EXTENSION_FACTOR * self.asked
            or time.perf_counter() - self._extension_started > self.MAX_EXTENSION_S
        ):
            return False
        recent = steps[self.warmup :]
        ordinary = statistics.median(s.duration for s in recent) if recent else 0.0
        # Only validation/checkpoints (outside the step) big enough to move the verdict: under 5% of the
        # window spread over it, its period does not matter.
        seen_once = [
            p
            for p in find_periodic(steps)
            if p.every is None and p.category == "outside_step" and p.cost_s >= 0.05 * len(recent) * ordinary
        ]
        if not seen_once:
            return False
        self.measure += 1
        self.profile_at += 1
        if self.stop_after is not None:
            self.stop_after += 1
        return True
