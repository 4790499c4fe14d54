"""`straggler`: on a multi-process job, the rank the others wait for at the gradient all-reduce: its host, the phase
that explains it (its recompiles, where torch.compile compiled on it and not on the others), the others' wait per
step.

Reads: every rank's run.
Applies to: a multi-process job.
Edit: the straggler's work less often: `if (step + 1) % N == 0:` around its `torch.save` (inside its `if rank ==
0:`), the period of the `if` that runs its work (`EVAL_EVERY = 2` becomes the cadence timed), or, for a data
straggler, `num_workers=N, persistent_workers=True` in its DataLoader call (N timed on every rank).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...analysis.branch import branch_running
from ...analysis.periodic import suggested_every
from ...analysis.rank_compile import RankCompile
from ...analysis.ranks import RankAnalysis, Straggler
from ...edits import ByHand, EditSpec
from ...findings import Category, Evidence, Finding, Fix, LateCause
from ...record.measurements import CATEGORIES
from ...rank_change import RankChange
from ...requests import JobRequest
from ..common import CAUSE_WORDS, cap_if_oversubscribed, rank_change_edit
from ..compile._recompile_fix import fix_for, kind_words
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...record.recording import Recording


_FIXES = {
    "data_loading": "Feed rank {rank} as fast as the others: more DataLoader workers or faster storage for its "
    "shard, and shards of equal size on every rank (DistributedSampler).",
    "host_to_device": "Pin rank {rank}'s batches and copy them with non_blocking=True; check its device link.",
    "compute": "Even out the work: the same batch size and sequence lengths on every rank, and no other load on "
    "rank {rank}'s cores (threads per rank x ranks <= cores).",
    "optimizer": "Use the same optimizer settings on every rank (foreach/fused), and nothing extra in rank "
    "{rank}'s step. Where its step is already the same as the others' (DDP's replicated parameters), its core ran "
    "it slower: give rank {rank} a core of its own (no other process, no busy hyperthread sibling) or check its "
    "node.",
    "host_sync": "Take the host syncs (.item(), print of a tensor) out of rank {rank}'s step, or do them every N "
    "steps on every rank.",
    "outside_step": "Do rank {rank}'s extra work (checkpoint, evaluation, logging) less often, asynchronously, or "
    "shared by every rank: the others wait for it at the next all-reduce.",
    "unexplained": "Look at rank {rank}'s host for other load; compare its script path with the others'.",
    "cpu_contention": "Give every rank cores of its own: nothing else running on rank {rank}'s cores, and ranks x "
    "threads per rank <= cores (OMP_NUM_THREADS, torch.set_num_threads).",
}


@dataclass(frozen=True)
class BranchEvidence(Evidence):
    """The ``if`` of the script's loop that runs the straggler's work, and the period timed for it."""

    at: str
    file: str
    period: int | None  # K of its ``step % K``; None: its test has none
    new_period: int
    call: str | None  # the function its body calls to run the work
    call_line: int


@dataclass(frozen=True)
class WorkersEvidence(Evidence):
    now: int
    timed: int


@dataclass(frozen=True)
class RecompileCause(Evidence):
    """A straggler late from torch.compile: its compiles in the measured steps against the compared rank's."""

    recompiles: int  # in the measured steps
    compile_ms: float  # its compile time there (first compiles and recompiles, backward included)
    recompile_ms: float
    others_recompiles: int  # the rank it is compared with
    others_compile_ms: float
    eager: bool  # it hit the recompile limit and ran eagerly in the measured steps
    kind: str  # what failed the guard (compile_watch's NEW_SHAPE, ...)
    guard: str  # torch's failed guard, the first in the measured steps (or the limit's last)
    where: str | None  # the user's line whose call brought the new input


@dataclass(frozen=True)
class StragglerEvidence(Evidence):
    rank: int
    host: str
    cause: LateCause
    cost_ms: float
    compared_with: int
    periodic: bool
    gap_ms: dict[Category, float]
    cpu_wait_ms: float | None = None  # its extra wait for a core, where that is the cause
    # The fix timed on every rank, where there is one: the save every N steps, the ``if`` of its work taken less
    # often, or more DataLoader workers.
    save_every: int | None = None
    branch: BranchEvidence | None = None
    num_workers: WorkersEvidence | None = None
    absorbed: tuple[str, ...] | None = None  # the rules whose findings of the same line and phase it took in
    recompile: RecompileCause | None = None  # where the cause is "recompile"


# A fix to time on every rank, as the straggler's finding says it: its request, its fix and its evidence.
_Timed = tuple[JobRequest, Fix, StragglerEvidence]


def straggler(ctx: Context) -> Iterator[Finding]:
    job = ctx.job
    if job is None or job.straggler is None:
        return
    s = job.straggler
    cause = CAUSE_WORDS.get(s.cause, s.cause)
    gap = s.gap_s.get(s.cause) if s.cause in CATEGORIES else None  # "cpu_contention", "unexplained": none
    more = "more in those steps" if s.periodic else "more per step"
    gap_text = f" ({gap * 1e3:.1f} ms {more} than rank {s.compared_with})" if gap is not None else ""
    host = f" on {s.host}" if s.host else ""
    evidence = StragglerEvidence(
        rank=s.rank,
        host=s.host,
        cause=s.cause,
        cost_ms=round(s.cost_s * 1e3, 3),
        compared_with=s.compared_with,
        periodic=s.periodic,
        gap_ms={k: round(v * 1e3, 3) for k, v in s.gap_s.items()},
        cpu_wait_ms=round((s.contention_s or 0.0) * 1e3, 3) if s.cause == "cpu_contention" else None,
    )
    fix = Fix(pytorch=_FIXES.get(s.cause, _FIXES["unexplained"]).format(rank=s.rank))
    if s.compile is not None:
        said, evidence, fix = _recompiled(ctx, job, s, evidence)
        gap_text = f": {said}"
    timed: _Timed | None = None
    if s.cause == "outside_step":
        timed = _time_rarer_saves(ctx, job, s, evidence) or _time_rarer_branch(ctx, job, s, evidence)
    elif s.cause == "data_loading":
        timed = _time_more_workers(ctx, job, s, evidence)
    request: JobRequest | None = None
    if timed is not None:
        request, fix, evidence = timed
    finding = Finding(
        rule="straggler",
        message=(
            f"Rank {s.rank}{host} holds every rank back: the others wait {s.cost_s * 1e3:.1f} ms per step "
            f"({s.cost_share:.0%} of the step) for it at {job.waited_on}; the cause is {cause}"
            f"{gap_text}. "
            + (
                f"It made them wait for that work in {s.last_share:.0%} of the measured steps; per step, their wait "
                "in those steps is averaged over every step."
                if s.periodic
                else f"It arrived last in {s.last_share:.0%} of the measured steps."
            )
        ),
        fix=fix,
        site=s.site,
        category=s.cause if s.cause != "unexplained" else None,
        evidence=evidence,
        request=request,
    )
    # The gain is read from the other ranks' waiting time, not timed with a fix applied.
    finding.set_gain(s.cost_share, measured=False)
    if s.cause == "cpu_contention":
        finding.cap(
            "low",
            f"Rank {s.rank} used {(s.cpu_gap_s or 0.0) * 1e3:+.1f} ms of CPU per step against rank "
            f"{s.compared_with} and waited {(s.contention_s or 0.0) * 1e3:+.1f} ms more for a core: the "
            "machine's load, not the script; it goes away on cores of its own.",
        )
    cap_if_oversubscribed(ctx, finding)
    yield finding


def _recompiled(
    ctx: Context, job: RankAnalysis, s: Straggler, evidence: StragglerEvidence
) -> tuple[str, StragglerEvidence, Fix]:
    """The words, evidence and fix of a straggler late from its compiles (``s.compile``) against the compared
    rank's: the compile-recompile rule's fix, for the rank that recompiled."""
    mine = s.compile
    assert mine is not None
    theirs = next((r.compile for r in job.ranks if r.rank == s.compared_with), None)
    other_n, other_s = (theirs.recompiles, theirs.window_s) if theirs is not None else (0, 0.0)
    where = ctx.where(mine.site)
    parts = []
    if mine.window_s > 0:
        parts.append(
            f"{mine.recompiles} recompile(s) in the measured steps, {mine.window_s:.2f} s of compiling there "
            f"(rank {s.compared_with}: {other_n} recompile(s), {other_s:.2f} s)"
            + (f", the first for {kind_words(mine.kind)}: {mine.guard}" if mine.first is not None else "")
        )
    if mine.eager_in_window and mine.limit is not None:
        parts.append(
            f"it hit torch.compile's {mine.limit.limit} and ran eagerly while rank {s.compared_with} ran compiled "
            f"(the last failed guard: {mine.limit.guard})"
        )
    said = "; ".join(parts) + (f" (at {where})" if where else "")
    cause = _cause_evidence(mine, theirs, where)
    fix = fix_for(mine.kind)
    pytorch = (
        f"{fix.pytorch}: rank {s.rank} compiled again for inputs the others did not see (the compile-recompile fix, "
        "applied on every rank)"
    )
    return said, dataclasses.replace(evidence, recompile=cause), dataclasses.replace(fix, pytorch=pytorch)


def _cause_evidence(mine: RankCompile, theirs: RankCompile | None, where: str | None) -> RecompileCause:
    return RecompileCause(
        recompiles=mine.recompiles,
        compile_ms=round(mine.window_s * 1e3, 3),
        recompile_ms=round(mine.recompile_s * 1e3, 3),
        others_recompiles=theirs.recompiles if theirs is not None else 0,
        others_compile_ms=round(theirs.window_s * 1e3, 3) if theirs is not None else 0.0,
        eager=mine.eager_in_window,
        kind=mine.kind,
        guard=mine.guard,
        where=where,
    )


def _own_recording(ctx: Context, s: Straggler) -> Recording | None:
    """The straggler's own recording, among the job's."""
    ranks = ctx.recording.job if ctx.recording is not None else ()
    return next((r for r in ranks if r.rank == s.rank), None)


def _time_rarer_saves(ctx: Context, job: RankAnalysis, s: Straggler, evidence: StragglerEvidence) -> _Timed | None:
    """A straggler late from its own torch.save at one line: time the save every N steps on every rank, N the
    cadence at which the save costs under 5% of the step."""
    recording = _own_recording(ctx, s)
    if s.site is None or recording is None:
        return None
    count, seconds, _ = next(
        (e.total(job.steps) for e in recording.events if e.kind == "save" and e.site == s.site), (0, 0.0, 0)
    )
    if count != len(job.steps):  # one save per step: the edit's ``if (step + 1) % N == 0:`` fits it
        return None
    per_save = seconds / count
    step = max(r.step_s for r in job.ranks)
    every = max(2, suggested_every(per_save, max(step - per_save, 1e-6), 1))
    fix = Fix(
        pytorch=f"Save rank {s.rank}'s checkpoint every {every} steps, not every step (`if (step + 1) % {every} == "
        "0:` around torch.save), or write it from a background thread after copying the state to CPU: the "
        "others wait for it at the next all-reduce."
    )
    request = JobRequest(RankChange(save_every=every, save_at=f"{s.site.file}:{s.site.line}"))
    return request, fix, dataclasses.replace(evidence, save_every=every)


def _time_rarer_branch(ctx: Context, job: RankAnalysis, s: Straggler, evidence: StragglerEvidence) -> _Timed | None:
    """A straggler late from work an ``if`` of the script's loop runs (``if rank == 0 and step % 2 == 0:
    evaluate()``): time that ``if`` taken on one pass in N on every rank, N the factor that puts the work under 5%
    of the step, as the same test with a period N times longer would."""
    if s.site is None or ctx.script is None:
        return None
    branch = branch_running(ctx.sources, s.site)
    if branch is None or branch.site.file != ctx.script:
        return None
    # The work's cost each time it runs: the others' wait averaged over the steps it was late in.
    per_run = s.cost_s / max(s.last_share, 1e-9)
    period = branch.period or max(1, round(1 / max(s.last_share, 1e-9)))
    step = s.cost_s / s.cost_share if s.cost_share > 0 else max(r.step_s for r in job.ranks)
    new_period = suggested_every(per_run, max(step - s.cost_s, 1e-6), period)
    every = max(2, new_period // period)
    said = BranchEvidence(
        at=branch.site.where(),
        file=branch.site.file,
        period=branch.period,
        new_period=period * every,
        call=branch.call,
        call_line=branch.call_line,
    )
    request = JobRequest(RankChange(branch_every=every, branch_at=f"{branch.site.file}:{branch.site.line}"))
    was = f"every {period} steps (the period in its `if`)" if branch.period else "every step"
    fix = Fix(
        pytorch=f"Run rank {s.rank}'s work at {branch.site.where(ctx.base)} every {period * every} steps, not "
        f"{was}, or share it over every rank (each evaluating its slice): the others wait for it at the next "
        "all-reduce."
    )
    return request, fix, dataclasses.replace(evidence, branch=said)


# Worker processes per rank the data what-if asks for at most.
MAX_WORKERS = 8


def _time_more_workers(ctx: Context, job: RankAnalysis, s: Straggler, evidence: StragglerEvidence) -> _Timed | None:
    """A straggler late from its DataLoader at one line: time every rank's DataLoaders with enough worker processes
    to fetch a batch in the time the median rank works a step (map-style datasets only)."""
    recording = _own_recording(ctx, s)
    loader = next((lo for lo in recording.loaders if lo.site == s.site), None) if recording is not None else None
    if loader is None or loader.settings.get("iterable"):
        return None
    count, waited, _ = loader.nexts.total(job.steps)
    # The pace to keep: the median rank's own work per step, without its wait for the straggler.
    pace = next((r.busy_s for r in job.ranks if r.rank == s.compared_with), 0.0)
    if count == 0 or pace <= 0:
        return None
    now, per_batch = int(loader.settings.get("num_workers") or 0), waited / count
    # A batch every ``pace`` seconds from workers that each take the wait a batch has now, and one to spare.
    workers = min(MAX_WORKERS, max(2 * now, math.ceil(per_batch / pace) + 1))
    if workers <= now:
        return None
    fix = Fix(
        pytorch=f"DataLoader(..., num_workers={workers}, persistent_workers=True) on every rank: rank {s.rank} waits "
        f"{1e3 * per_batch:.1f} ms for each batch, and workers fetch the next ones while it trains; then give "
        "its shard storage as fast as the others'.",
        lightning=f"DataLoader(..., num_workers={workers}, persistent_workers=True) in the DataModule",
    )
    request = JobRequest(RankChange(loader_workers=workers))
    return request, fix, dataclasses.replace(evidence, num_workers=WorkersEvidence(now=now, timed=workers))


def absorbed_by_straggler(findings: list[Finding]) -> list[Finding]:
    """A straggler's finding whose fix is timed on every rank absorbs another rule's about the same line and
    phase (rank 0's ``save-in-loop`` at the line that makes it late): one finding per cause, the one that says
    who waits for it and what the fix buys the whole job."""
    stragglers = [f for f in findings if f.rule == "straggler" and f.site is not None and f.request is not None]
    out = []
    for f in findings:
        by = next((s for s in stragglers if f is not s and (f.site, f.category) == (s.site, s.category)), None)
        if by is None:
            out.append(f)
            continue
        evidence = by.evidence_as(StragglerEvidence)
        by.evidence = dataclasses.replace(evidence, absorbed=(*(evidence.absorbed or ()), f.rule))
        # Its fix in the user's framework, where the straggler's does not say it.
        frameworks = ("lightning", "fabric", "accelerate", "hf_trainer")
        by.fix = dataclasses.replace(by.fix, **{n: getattr(f.fix, n) for n in frameworks if getattr(by.fix, n) is None})
    return out


def edit(ctx: Context, f: Finding) -> EditSpec:
    """The fix timed on every rank (:func:`~..common.rank_change_edit`); the work's ``if`` taken less often as the
    edit of its period, or of its call."""
    change = f.request.change if isinstance(f.request, JobRequest) else None
    if change is not None and change.branch_every is not None:
        return _rarer_branch(f, change.branch_every)
    return rank_change_edit(ctx, f)


def _rarer_branch(f: Finding, every: int) -> EditSpec:
    """The straggler's work run ``every`` times less often: the period of its ``if`` (``step % 2`` to ``step %
    2N``), or, under a rank test alone, ``if (step + 1) % N == 0:`` around the call that runs it."""
    evidence = f.evidence_as(StragglerEvidence)
    branch = evidence.branch
    if branch is not None and branch.period:
        return EditSpec(
            "cadence",
            f"rank {evidence.rank}'s work every {branch.period * every} steps (was {branch.period})",
            params={
                "every": branch.period,
                "new_every": branch.period * every,
                "kind": "work",
                "function": branch.call,
            },
        )
    if branch is not None and branch.call and branch.call_line:
        return EditSpec(
            "save_every",
            f"{branch.call}() every {every} steps (was every step)",
            params={"every": every, "call": branch.call},
            file=branch.file,
            line=branch.call_line,
        )
    raise ByHand(f.fix.pytorch)


RULE = register(Rule("straggler", detect=(Detect("runtime", straggler),), edit=edit))
