"""Work that recurs between steps (validation, checkpoints): spikes in one category of the recorded steps, their
period and what each occurrence costs. The window reads it while the script runs (to extend itself until a
period shows); the breakdown spreads each occurrence over its period.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .measurements import CATEGORIES, StepRecord

__all__ = ["PERIODIC_CATEGORIES", "PERIODIC_FLOOR_S", "Periodic", "find_periodic"]


PERIODIC_CATEGORIES = ("outside_step",)


@dataclass
class Periodic:
    """Work recurring every ``every`` steps in ``category``, amortised over its period."""

    category: str
    steps: list[int]                 # step indices where it happened
    every: int | None                # steps between occurrences; None: seen once (the period is unknown)
    cost_s: float                    # seconds each occurrence adds over an ordinary step
    base_s: float                    # an ordinary step's seconds in that category (the median)
    around: tuple[str, ...] = ()     # other categories whose excess on these steps is part of cost_s

    @property
    def amortised_s(self) -> float:
        return self.cost_s / self.every if self.every else 0.0


def find_periodic(steps: list[StepRecord], first: int = 1) -> list[Periodic]:
    """Recurring spikes per category over ``steps`` (from index ``first``: step 0 holds the script's setup).

    A spike is a step whose category time exceeds 3x the median plus half an ordinary step (and
    at least 2 ms): well past a scheduler hiccup, and a real cost. Its period is the median gap
    between spikes. Its cost is the spike's excess plus what the same steps take over the median in
    the other phases: the work around a validation (``model.train()``, the loop's resumption, caches
    the validation batches evicted) is gone with it when it runs less often.
    """
    chosen = [s for s in steps if s.index >= first]
    if len(chosen) < 3:
        return []
    per_step = [s.categories() for s in chosen]
    floor = max(PERIODIC_FLOOR_S, 0.5 * statistics.median(s.duration for s in chosen))
    out = []
    for category in PERIODIC_CATEGORIES:
        values = _own_time(chosen, per_step, category)
        med = statistics.median(values)
        spikes = [(s.index, v) for s, v in zip(chosen, values) if v > 3 * med + floor]
        if not spikes or len(spikes) > len(chosen) // 2:
            continue  # none, or most steps: that is the step itself, not periodic work
        indices = [i for i, _ in spikes]
        gaps = [b - a for a, b in zip(indices, indices[1:])]
        around = _excess_around(chosen, per_step, set(indices), category)
        out.append(Periodic(category, indices, int(statistics.median(gaps)) if gaps else None,
                            statistics.fmean(v - med for _, v in spikes) + sum(around.values()), med,
                            tuple(around)))
    return out


def _own_time(chosen: list[StepRecord], per_step: list[dict[str, float]], category: str) -> list[float]:
    """Each step's seconds in ``category``. Time another process held the CPU is not the script's work; a long
    step loses it all along, so it comes out in proportion (a short stall in an ordinary step then stays under
    the spike threshold)."""
    return [c[category] * (1.0 - min(1.0, (s.preempted or 0.0) / s.duration)) if s.duration > 0 else 0.0
            for s, c in zip(chosen, per_step)]


def _excess_around(chosen: list[StepRecord], per_step: list[dict[str, float]], at: set[int],
                   category: str) -> dict[str, float]:
    """Per other category, the mean seconds the steps ``at`` take over that category's median, where positive."""
    out = {}
    for other in CATEGORIES:
        if other == category or other in PERIODIC_CATEGORIES:
            continue
        values = _own_time(chosen, per_step, other)
        med = statistics.median(values)
        excess = statistics.fmean(v - med for s, v in zip(chosen, values) if s.index in at)
        if excess > 0:
            out[other] = excess
    return out


PERIODIC_FLOOR_S = 0.002
