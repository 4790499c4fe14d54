"""`uneven-work`: on a multi-process job with no straggler, ranks late in turns: the first rank to reach the all-reduce
waits 10% of the step or more for the last, no rank last in 3 steps of 4, and the phase the last one spent longer
in; `low` unless the last rank's training forwards took the larger batch (more tensor elements) in 3 steps of 4:
with batches of one size, noise and contention explain turns as well; where the last rank's compiling holds half the
wait, the cause is its recompiles, with `compile-recompile`'s fix at the line that brought the new input.

Reads: every rank's run.
Applies to: a multi-process job.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...analysis.ranks import CONSISTENT
from ...findings import Evidence, Finding, Fix, LateCause
from ..common import CAUSE_WORDS, cap_if_oversubscribed
from ..compile._recompile_fix import fix_for, kind_words
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


_UNEVEN_FIXES = {
    "compute": "Give every rank the same work per step: batches of sequences bucketed by length (the same padded "
    "length on every rank in a step), a fixed token budget per batch, or a sampler that balances lengths "
    "across ranks.",
    "data_loading": "Even out the reads: DataLoader workers on every rank (num_workers > 0) so a slow batch is "
    "fetched ahead, and samples of similar cost in each rank's shard.",
}


_SAME_SIZE_FIX = (
    "The batches had one size on every rank: give each rank cores of its own (nothing else on them, ranks x threads "
    "per rank <= cores) and see whether the turns stay; if they do, look for work that differs with the data."
)


@dataclass(frozen=True)
class UnevenEvidence(Evidence):
    cost_ms: float
    first_wait_ms: float  # per step, the first rank's wait for the last
    last_shares: dict[str, float]  # per rank, the share of steps it arrived last in
    cause: LateCause
    cause_gap_ms: float
    cpu_gap_ms: float | None
    larger_input_share: float  # of the steps, those the last rank had the larger batch in
    compile_gap_ms: float = 0.0  # per step: the last rank's compile time minus the first rank's
    recompiles: int | None = None  # where the cause is "recompile": of the rank that recompiled most, in the window
    guard: str | None = None  # ... the first guard that failed there
    where: str | None = None  # ... the user's line that brought the new input


def uneven_work(ctx: Context) -> Iterator[Finding]:
    """No rank is late every step, yet each step waits for whichever rank got more work."""
    job = ctx.job
    if job is None or job.imbalance is None:
        return
    u = job.imbalance
    sized = u.larger_input_share >= CONSISTENT  # the late rank had the larger batch: the evidence of uneven work
    turns = ", ".join(f"rank {rank} in {share:.0%}" for rank, share in sorted(u.last_shares.items()))
    recompiled = u.recompiled if u.cause == "recompile" else None
    where = ctx.where(recompiled.site) if recompiled is not None else None
    if recompiled is not None:
        counts = ", ".join(f"rank {r.rank} {r.compile.recompiles if r.compile else 0}" for r in job.ranks)
        why = (
            f", and the last one was compiling: {u.compile_gap_s * 1e3:.1f} ms more per step than the first one "
            f"(recompiles in the measured steps: {counts}; the first for {kind_words(recompiled.kind)}: "
            f"{recompiled.guard}" + (f", at {where})" if where else ")")
        )
        fix = fix_for(recompiled.kind)
        fix = dataclasses.replace(
            fix,
            pytorch=f"{fix.pytorch}: each rank compiled again in the steps it met new inputs (the "
            "compile-recompile fix, applied on every rank)",
        )
    else:
        if u.cause == "unexplained":
            why = ", and no phase of the last one explains it"
        else:
            why = (
                f", and the last one's {CAUSE_WORDS.get(u.cause, u.cause).removeprefix('its ')} took "
                f"{u.cause_gap_s * 1e3:.1f} ms more than the first one's, and its batch was the larger one in "
                f"{u.larger_input_share:.0%} of the steps"
            )
        fix = Fix(pytorch=_UNEVEN_FIXES.get(u.cause, _UNEVEN_FIXES["compute"]) if sized else _SAME_SIZE_FIX)
    finding = Finding(
        rule="uneven-work",
        message=(
            f"No single rank is late, yet every step waits for one: the rank that arrived first at the gradient "
            f"all-reduce waited {u.first_wait_s * 1e3:.1f} ms per step on average for the one that arrived last. "
            f"The ranks were last in turns ({turns}){why}. Evened out, each step would take the ranks' mean "
            f"work: {u.cost_s * 1e3:.1f} ms ({u.cost_share:.0%} of the step) less."
        ),
        fix=fix,
        site=recompiled.site if recompiled is not None else None,
        category=u.cause,
        evidence=UnevenEvidence(
            cost_ms=round(u.cost_s * 1e3, 3),
            first_wait_ms=round(u.first_wait_s * 1e3, 3),
            last_shares={str(k): round(v, 3) for k, v in u.last_shares.items()},
            cause=u.cause,
            cause_gap_ms=round(u.cause_gap_s * 1e3, 3),
            cpu_gap_ms=round(u.cpu_gap_s * 1e3, 3) if u.cpu_gap_s is not None else None,
            larger_input_share=round(u.larger_input_share, 3),
            compile_gap_ms=round(u.compile_gap_s * 1e3, 3),
            recompiles=recompiled.recompiles if recompiled is not None else None,
            guard=recompiled.guard if recompiled is not None else None,
            where=where,
        ),
    )
    # The gain is read from the waiting, not timed with the work evened out.
    finding.set_gain(u.cost_share, measured=False)
    if u.cause == "unexplained":
        finding.cap(
            "low",
            f"No phase of the late rank explains the turns (the largest, {u.cause_gap_s * 1e3:.1f} ms, is under half "
            "the wait): step-to-step noise explains them as well.",
        )
    # Batches of other sizes are the evidence: ranks given the same sizes are late in turns from noise as well
    # (a wait for a core, a slower step now and then), and more so on a loaded machine. The compile time a rank
    # spent in the steps it was last in is evidence of its own.
    elif not sized and recompiled is None:
        finding.cap(
            "low",
            f"The last rank's batch was the larger one in only {u.larger_input_share:.0%} of the steps: a wait for a "
            "core or step-to-step noise explains the turns as well as uneven work does.",
        )
    cap_if_oversubscribed(ctx, finding)
    yield finding


RULE = register(Rule("uneven-work", detect=(Detect("runtime", uneven_work),)))
