"""Work that recurs between steps (validation, checkpoints): spikes in one category of the recorded steps, their
period and what each occurrence costs. The window reads it while the script runs (to extend itself until a
period shows); the breakdown spreads each occurrence over its period. Work at a period beyond the window is
read from the steps the watch after it kept (:func:`find_watched`, :mod:`.watch`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .measurements import CATEGORIES, Category, Phase, StepRecord
from .cadence import Cadence
from .watch import WatchedRun
from ..sites import Site

__all__ = [
    "PERIODIC_CATEGORIES",
    "PERIODIC_FLOOR_S",
    "WORK_PHASES",
    "Periodic",
    "find_periodic",
    "find_watched",
    "on_grid",
    "beyond_window",
    "spike_line",
]


PERIODIC_CATEGORIES: tuple[Category, ...] = ("outside_step",)
# Phases the script's own work between steps runs in: a step that holds one is an occurrence of that work.
WORK_PHASES: tuple[Phase, ...] = ("eval", "eval_grad", "save")


@dataclass
class Periodic:
    """Work recurring every ``every`` steps in ``category``, amortised over its period."""

    category: Category
    steps: list[int]  # step indices where it happened
    every: int | None  # steps between occurrences; None: seen once (the period is unknown)
    cost_s: float  # seconds each occurrence adds over an ordinary step
    base_s: float  # an ordinary step's seconds in that category (the median)
    around: tuple[Category, ...] = ()  # other categories whose excess on these steps is part of cost_s
    # Found by watching the step clock after the window (not in the window's steps, not in its breakdown), and
    # how its period was known: "gaps" between occurrences, or "code" (the loop's ``% N`` test, one occurrence).
    watched: bool = False
    period_from: str = "gaps"
    site: Site | None = None  # the loop's ``if step % N`` whose grid the occurrences fall on: the script's own work

    @property
    def amortised_s(self) -> float:
        return self.cost_s / self.every if self.every else 0.0


def find_periodic(steps: list[StepRecord], first: int = 1) -> list[Periodic]:
    """Recurring spikes per category over ``steps`` (from index ``first``: step 0 holds the script's setup).

    A spike is a step whose category time exceeds 3x an ordinary step's (the lower quartile) plus half the median
    step (and at least 2 ms): well past a scheduler hiccup, and a real cost; where the script's own work shows
    (:data:`WORK_PHASES`), every step that ran it is one, if their mean crosses that line. Its period is the median gap
    between spikes. Its cost is the spike's excess plus what the same steps take over the median in
    the other phases: the work around a validation (``model.train()``, the loop's resumption, caches
    the validation batches evicted) is gone with it when it runs less often.
    """
    chosen = [s for s in steps if s.index >= first]
    if len(chosen) < 3:
        return []
    per_step = [s.categories() for s in chosen]
    out = []
    for category in PERIODIC_CATEGORIES:
        values = _own_time(chosen, per_step, category)
        med, over = spike_line(chosen, values)
        spikes = [(s.index, v) for s, v in zip(chosen, values) if v > over]
        # Steps where the script's own work ran (an evaluation forward, a save) are its occurrences where, on
        # average, they cross the threshold: on a busy machine one that lost its CPU to another process can fall
        # under it alone (work every 2 steps seen at steps 1, 5, 7 read "every 3").
        worked = [(s.index, v) for s, v in zip(chosen, values) if any(s.phases.get(p) for p in WORK_PHASES)]
        if worked and statistics.fmean(v for _, v in worked) > over:
            spikes = worked
        if not spikes or len(spikes) > len(chosen) // 2:
            continue  # none, or most steps: that is the step itself, not periodic work
        indices = [i for i, _ in spikes]
        gaps = [b - a for a, b in zip(indices, indices[1:])]
        around = _excess_around(chosen, per_step, set(indices), category)
        out.append(
            Periodic(
                category,
                indices,
                int(statistics.median(gaps)) if gaps else None,
                statistics.fmean(v - med for _, v in spikes) + sum(around.values()),
                med,
                tuple(around),
            )
        )
    return out


def spike_line(chosen: list[StepRecord], values: list[float]) -> tuple[float, float]:
    """(an ordinary step's seconds, the seconds over which a step is a spike) for ``values``, one per step of
    ``chosen``: the ordinary is the lower quartile, which work every other step (half the steps) leaves ordinary,
    where a median would fall between the two kinds of step; a spike is over 3x it plus half the median step (and
    at least :data:`PERIODIC_FLOOR_S`): well past a scheduler hiccup, and a real cost."""
    ordinary = statistics.quantiles(values, n=4, method="inclusive")[0]
    floor = max(PERIODIC_FLOOR_S, 0.5 * statistics.median(s.duration for s in chosen))
    return ordinary, 3 * ordinary + floor


def _own_time(chosen: list[StepRecord], per_step: list[dict[Category, float]], category: Category) -> list[float]:
    """Each step's seconds in ``category``. Time another process held the CPU is not the script's work; a long
    step loses it all along, so it comes out in proportion (a short stall in an ordinary step then stays under
    the spike threshold)."""
    return [
        c[category] * (1.0 - min(1.0, (s.preempted or 0.0) / s.duration)) if s.duration > 0 else 0.0
        for s, c in zip(chosen, per_step)
    ]


def _excess_around(
    chosen: list[StepRecord], per_step: list[dict[Category, float]], at: set[int], category: Category
) -> dict[Category, float]:
    """Per other category, the mean seconds the steps ``at`` take over that category's median, where positive."""
    out: dict[Category, float] = {}
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


def find_watched(watched: WatchedRun | None, steps: list[StepRecord], first: int = 1) -> list[Periodic]:
    """Work recurring at a period beyond the window, from the occurrences the watch after it kept.

    Each occurrence costs its step's own time over the ordinary watched step; the category is ``outside_step``
    where validation or a checkpoint ran in them, else the one that grew most over the window's median (the
    rest is ``around``). The period is the median gap between
    occurrences, or, with one occurrence, the longest cadence of the running loop (``if step % N == 0``) it
    falls on (``period_from="code"``)."""
    if watched is None:
        return []
    spikes = [s for s in watched.spikes if s.index >= first]
    chosen = [s for s in steps if s.index >= first and not s.profiled]
    if not spikes or not chosen:
        return []
    # Where two or more occurrences fall on the grid of one of the loop's ``% N`` tests, that is the work and its
    # period; the occurrences off it are other processes taking the CPU (a plot every 50 steps read "every 7").
    cadence: Cadence | None = None
    spikes_on_grid: list[StepRecord] = []
    for c in sorted((c for c in watched.cadences if c.every >= 2), key=lambda c: -c.every):
        on_it = [s for s in spikes if on_grid(s.index, c.every)]
        if len(on_it) >= 2 and (cadence is None or len(on_it) > len(spikes_on_grid)):
            cadence, spikes_on_grid = c, on_it
    if cadence is not None:
        spikes = spikes_on_grid
    per_step = [s.categories() for s in chosen]
    medians = {c: statistics.median(_own_time(chosen, per_step, c)) for c in CATEGORIES}
    spike_cats = [s.categories() for s in spikes]
    excess = {c: statistics.fmean(v - medians[c] for v in _own_time(spikes, spike_cats, c)) for c in CATEGORIES}
    # Validation or a checkpoint in those steps makes it theirs (its batches built untimed included).
    category: Category = "outside_step" if excess["outside_step"] > 0 else max(excess, key=lambda c: excess[c])
    around = tuple(c for c in CATEGORIES if c != category and excess[c] > 0)
    cost = statistics.fmean(s.duration - (s.preempted or 0.0) for s in spikes) - watched.ordinary_s
    indices = [s.index for s in spikes]
    gaps = [b - a for a, b in zip(indices, indices[1:])]
    every, source = (int(statistics.median(gaps)), "gaps") if gaps else (None, "gaps")
    near = [c for c in watched.cadences if on_grid(indices[0], c.every)]
    if cadence is not None:
        every, source = cadence.every, "code"
    elif every is None and near:
        cadence = max(near, key=lambda c: c.every)
        every, source = cadence.every, "code"
    elif every is not None:
        # The loop's own N where the gaps show it (a step counted one off at either end moves a gap by one).
        cadence = next((c for c in sorted(near, key=lambda c: -c.every) if abs(c.every - every) <= 1), None)
        every = cadence.every if cadence is not None else every
    site = cadence.site if cadence is not None else None
    return [
        Periodic(
            category,
            indices,
            every,
            max(0.0, cost),
            medians[category],
            around,
            watched=True,
            period_from=source,
            site=site,
        )
    ]


def on_grid(index: int, every: int) -> bool:
    """Whether step ``index`` is where ``if step % every == 0`` fires (one off either way: the script may count
    its steps from 1, or run the work after the optimizer step)."""
    return min(index % every, every - index % every) <= 1


def beyond_window(watched: list[Periodic], window: list[Periodic]) -> list[Periodic]:
    """The watch's recurring work less what the window already holds (occurrences on the grid of a period the
    window measured)."""
    known = [(p.steps[0], p.every) for p in window if p.every and p.steps]
    return [w for w in watched if not any(all(on_grid(i - first, every) for i in w.steps) for first, every in known)]
