"""Per rank of a job: what torch.compile compiled inside the measured steps, and whether it made that rank late.

Each rank's :class:`~..record.compile_watch.CompileFacts` carries every compile's start on the rank's step clock
(``spans``); a compile belongs to the measured step it started in. A rank that compiles in a step the others do not
(a new input shape only it sees, recompiling each time) keeps them waiting at the next collective, and so does a
rank that hit the recompile limit and runs the code eagerly while the others run it compiled.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..record.compile_watch import CompileFacts, Fallback, Recompile
from ..record.measurements import StepRecord
from ..sites import Site

__all__ = ["RankCompile", "rank_compile", "compile_explains"]

# The straggler's compile seconds explain its lateness when, per step (median), they exceed the compared rank's by
# at least this share of the others' wait for it.
EXPLAINS = 0.5


@dataclass(frozen=True)
class RankCompile:
    """One rank's compiles inside the measured steps (first compiles and recompiles, backward included)."""

    window_s: float  # compile seconds that started in the measured steps
    recompile_s: float  # of which recompiles
    recompiles: int  # recompiles that started in the measured steps
    run_recompiles: int  # over the whole run
    eager_in_window: bool  # a code hit the recompile limit before the last measured step ended (or torch gave no time)
    per_step_s: tuple[float, ...]  # compile seconds per measured step, in the analysis' order of steps
    first: Recompile | None = None  # the first recompile in the measured steps: its guard and the user's line
    limit: Fallback | None = None  # the recompile limit hit: the code ran eagerly from then on

    @property
    def kind(self) -> str:
        """What failed the guard (NEW_SHAPE, ...): of the first recompile in the window, else of the limit's."""
        said = self.first or self.limit
        return said.kind if said is not None else ""

    @property
    def guard(self) -> str:
        said = self.first or self.limit
        return said.guard if said is not None else ""

    @property
    def site(self) -> Site | None:
        """The user's line that brought the new input (a recompile's caller), or that hit the limit."""
        if self.first is not None:
            return self.first.caller or self.first.site
        return self.limit.caller if self.limit is not None else None


def _step_of(start: float, steps: list[StepRecord]) -> int | None:
    return next((s.index for s in steps if s.start <= start < s.end), None)


def rank_compile(facts: CompileFacts | None, measured: dict[int, StepRecord], steps: list[int]) -> RankCompile | None:
    """What ``facts`` compiled in ``steps`` (indices into ``measured``, a rank's measured steps); None where the
    rank did not compile."""
    if facts is None or not facts.compiled:
        return None
    chosen = [measured[i] for i in steps]
    per_step = dict.fromkeys(steps, 0.0)
    recompile_s, recompiled_ids = 0.0, []
    for span in facts.spans:
        index = _step_of(span.start, chosen)
        if index is None:
            continue
        per_step[index] += span.seconds
        if span.kind == "recompile":
            recompile_s += span.seconds
            recompiled_ids.append(span.compile_id)
    recompiles = {r.compile_id: r for c in facts.codes for r in c.recompiles}
    in_window = [recompiles[i] for i in dict.fromkeys(recompiled_ids) if i in recompiles]
    fallback = next((c.fallback for c in facts.codes if c.fallback is not None), None)
    limit_at = [s.start for s in facts.spans if s.kind == "limit"]
    end = chosen[-1].end if chosen else 0.0
    return RankCompile(
        window_s=sum(per_step.values()),
        recompile_s=recompile_s,
        recompiles=len(in_window),
        run_recompiles=facts.recompiles,
        eager_in_window=fallback is not None and (not limit_at or min(limit_at) < end),
        per_step_s=tuple(per_step[i] for i in steps),
        first=in_window[0] if in_window else None,
        limit=fallback,
    )


def compile_explains(mine: RankCompile | None, theirs: RankCompile | None, cost_s: float, cpu_work: bool) -> bool:
    """Whether a late rank's compiles explain the others' wait for it against the rank it is compared with: per
    step it compiled for at least half that wait longer than the other, or, late on its own work (``cpu_work``:
    compute, optimizer, ...), it runs eagerly after the recompile limit where the other does not."""
    if mine is None:
        return False
    other = theirs.per_step_s if theirs is not None else (0.0,) * len(mine.per_step_s)
    gap = statistics.median(a - b for a, b in zip(mine.per_step_s, other)) if other else 0.0
    if cost_s > 0 and gap >= EXPLAINS * cost_s:
        return True
    return cpu_work and mine.eager_in_window and not (theirs is not None and theirs.eager_in_window)
