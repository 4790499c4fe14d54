"""Work the script does now and then in the untimed time before a forward: a plot redrawn when an episode ends, a
log written after some steps. The breakdown charges that time to data loading; it is no batch building when it sits
in a few steps and a line of the script's own was caught running in it.

Told apart from batch building (every step) by how the measured steps' untimed time before their forward spreads (a
DataLoader's own waits are timed apart: not in it): spikes that hold most of it. Evidence of work is a function of
the script's (or a line at its module level) holding most of what the gap sampler caught, named at its busiest line;
without one, slow steps are the machine's (another process taking the CPU), not the script's. Time other processes
held the CPU is taken out of each step first, in proportion, where other processes were busy (as the window's
periodic work does, :mod:`~turbotrain.doctor.record.recurring`).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..record.measurements import StepRecord
from ..record.recurring import spike_line
from ..sites import Site

if TYPE_CHECKING:
    from .context import Context

__all__ = ["OccasionalWork", "occasional_work"]

MOST = 0.5  # of the untimed time in the spikes, and of the sampler's catches on one line
BUSY_CORES = 0.5  # other processes' busy cores from which a step's waits for a CPU are theirs


@dataclass(frozen=True)
class OccasionalWork:
    """Work before the forward in some measured steps only, at the line the sampler caught most."""

    site: Site
    steps: tuple[int, ...]  # the measured steps it ran in
    measured: int  # the measured steps
    cost_s: float  # each occurrence, over an ordinary step's untimed time
    share: float  # of the measured steps' time (less other processes' on a busy machine)
    base_step_s: float  # a measured step without it

    @property
    def every(self) -> float:
        """Measured steps per occurrence: a mean, as the script decides when it runs (an episode's end)."""
        return self.measured / len(self.steps)


def occasional_work(ctx: Context) -> OccasionalWork | None:
    """The occasional work of the module's docstring, where the run shows it; None where the untimed time is
    steady (batch building) or no line of the script's was caught in it."""
    if not ctx.gap_samples:
        return None
    measured = set(ctx.measured_steps)
    chosen = [s for s in ctx.step_records if s.index in measured]
    if len(chosen) < 4:
        return None
    # Run-queue waits count as other processes' only where other processes were busy: on a quiet machine a long
    # step's own waits (measured under the doctor, 30-50 ms of a 60 ms redraw step) would erase the work itself.
    busy = ctx.machine is not None and (ctx.machine.other_load or 0.0) >= BUSY_CORES
    values = [_untimed_before_forward(s, busy) for s in chosen]
    ordinary, over = spike_line(chosen, values)
    # Steps whose time the window's periodic work explains (a validation, a sample generated, a line of its own) are
    # that work's: counted again here, a stall in one of them would be named at whichever line the sampler caught.
    explained = {i for row in ctx.periodic_rows if row.site is not None for i in row.steps}
    spikes = [(s.index, v - ordinary) for s, v in zip(chosen, values) if v > over and s.index not in explained]
    excess = sum(e for _, e in spikes)
    if not spikes or len(spikes) > len(chosen) // 2 or excess < MOST * sum(values):
        return None
    # One function of the script's (a redraw: its lines together), or one line at the module's level, holding most
    # of what the sampler caught: a sampler that ran through a few occurrences splits them over their lines.
    held: Counter[tuple[str, object]] = Counter()
    for at, n in ctx.gap_samples.items():
        held[_holder(at)] += n
    holder, caught = held.most_common(1)[0]
    if caught < MOST * held.total():
        return None  # nothing of the script's holds the time: nothing to point at
    site = max((at for at in ctx.gap_samples if _holder(at) == holder), key=lambda at: ctx.gap_samples[at])
    # The steps' own time, less their CPU waits where those were other processes' (as the values above).
    own = sum(s.duration - (min(s.duration, s.preempted or 0.0) if busy else 0.0) for s in chosen)
    return OccasionalWork(
        site=site,
        steps=tuple(i for i, _ in spikes),
        measured=len(chosen),
        cost_s=statistics.fmean(e for _, e in spikes),
        share=excess / own if own > 0 else 0.0,
        base_step_s=max(1e-9, (own - excess) / len(chosen)),
    )


def _untimed_before_forward(step: StepRecord, busy: bool) -> float:
    """The step's untimed seconds before its first training forward (the data-loading share no call timed); on a
    ``busy`` machine less the share the step waited for a CPU."""
    before = min(step.untimed, step.gap_before_forward) if step.forwards else 0.0
    if not busy or step.duration <= 0:
        return before
    return before * (1.0 - min(1.0, (step.preempted or 0.0) / step.duration))


def _holder(site: Site) -> tuple[str, object]:
    """The function a sampled line is in (its lines counted together), or the line itself at the module's level."""
    return (site.file, site.function) if site.function not in ("", "<module>") else (site.file, site.line)
