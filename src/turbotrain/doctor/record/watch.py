"""The step clock kept running after the window, to find work that recurs at a period far longer than it.

An evaluation every 300 steps never shows in a 20-step window. When the loop that runs has a cadence
(``if step % N == 0:``, :mod:`.cadence`) whose second occurrence lies beyond the window, the script is not
ended with the window: its steps go on, with the same wrappers, but only their durations are kept, and the
steps that ran far over the ordinary one (the occurrences) are kept whole. The watch ends when the loop has
run past two periods of its longest cadence (three for an outer loop's), after three occurrences at least half
its shortest cadence apart, when ``budget_s`` seconds have passed, or when the script ends.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from .cadence import Cadence
from .measurements import StepRecord

__all__ = ["RunWatch", "WatchedRun", "SPIKE_FLOOR_S"]

# A step is an occurrence when it runs over 3x the ordinary step plus this (or half an ordinary step): a
# scheduler hiccup stays under it. Matches the window's own periodic spikes (:mod:`.recurring`).
SPIKE_FLOOR_S = 0.002
# Occurrences after which the period is known well enough to stop watching (three give two gaps).
ENOUGH_OCCURRENCES = 3


@dataclass(frozen=True, slots=True)
class WatchedRun:
    """What the watch after the window saw: how long, the ordinary step, and the steps that towered over it."""

    first: int  # index of the first step watched
    last: int  # index of the last step watched
    seconds: float  # wall seconds watched
    ordinary_s: float  # median duration of the watched steps
    spikes: tuple[StepRecord, ...]  # the watched steps that ran far over the ordinary one, whole
    cadences: tuple[Cadence, ...]  # the ``% N`` tests of the running loop that asked for the watch
    ended: str  # "periods" (two of the longest cadence seen), "occurrences", "budget" or "script"
    budget_s: float = 0.0

    @property
    def steps(self) -> int:
        return self.last - self.first + 1 if self.last >= self.first else 0


def _periods_to_see(cadence: Cadence) -> int:
    """Periods the watch waits for: two, and three for an outer loop's, whose period in steps is an estimate
    (its counter read twice, a whole number of iterations apart)."""
    return 3 if cadence.outer else 2


class RunWatch:
    """Takes the steps closed after the window; :meth:`add` says when it has seen enough."""

    def __init__(
        self, cadences: tuple[Cadence, ...], baseline_s: float, first: int, budget_s: float, now: float | None = None
    ) -> None:
        self.cadences = cadences
        self.first = first
        self.budget_s = budget_s
        self.until = max((_periods_to_see(c) * c.every + 2 for c in cadences), default=first)
        self.threshold_s = 3 * baseline_s + max(SPIKE_FLOOR_S, 0.5 * baseline_s)
        self.started = time.perf_counter() if now is None else now
        self.durations: list[float] = []
        self.spikes: list[StepRecord] = []
        # Occurrences count toward stopping only as far apart as half the shortest cadence: work that recurs
        # more often (a validation every epoch, already in the window) says nothing of the period watched for.
        beyond = [c.every for c in cadences if _periods_to_see(c) * c.every + 2 > first]
        self.spacing = max(1, min(beyond, default=2) // 2)
        self.counted: list[int] = []
        self.last = first - 1
        self.ended = "script"
        self.elapsed = 0.0

    @staticmethod
    def wanted(cadences: tuple[Cadence, ...], done: int) -> bool:
        """Whether a cadence's second occurrence lies beyond the ``done`` steps the window ran."""
        return any(_periods_to_see(c) * c.every + 2 > done for c in cadences)

    def add(self, record: StepRecord, now: float | None = None) -> bool:
        """One more watched step; True when the watch has seen enough (it then says why in ``ended``)."""
        own = record.duration - (record.preempted or 0.0)
        self.durations.append(own)
        self.last = record.index
        if own > self.threshold_s:
            self.spikes.append(record)
            if not self.counted or record.index - self.counted[-1] >= self.spacing:
                self.counted.append(record.index)
        self.elapsed = (time.perf_counter() if now is None else now) - self.started
        if record.index + 1 >= self.until:
            self.ended = "periods"
            return True
        if len(self.counted) >= ENOUGH_OCCURRENCES:
            self.ended = "occurrences"
            return True
        if self.elapsed > self.budget_s:
            self.ended = "budget"
            return True
        return False

    def freeze(self) -> WatchedRun:
        ordinary = statistics.median(self.durations) if self.durations else 0.0
        return WatchedRun(
            self.first, self.last, self.elapsed, ordinary, tuple(self.spikes), self.cadences, self.ended, self.budget_s
        )
