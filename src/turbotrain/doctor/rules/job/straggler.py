"""`straggler`: on a multi-process job, the rank the others wait for at the gradient all-reduce: its host, the phase
that explains it, the others' wait per step (below)

Reads: every rank's run (docs/doctor.md, "Findings").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterator

from ...analysis.branch import branch_running
from ...analysis.periodic import suggested_every
from ...analysis.ranks import RankAnalysis, Straggler
from ...findings import Finding, Fix
from ...record.measurements import CATEGORIES
from ...rank_change import RankChange
from ...requests import JobRequest
from ..common import CAUSE_WORDS, cap_if_oversubscribed, rank_change_edit
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
        fix=Fix(pytorch=_FIXES.get(s.cause, _FIXES["unexplained"]).format(rank=s.rank)),
        site=s.site,
        category=s.cause if s.cause != "unexplained" else None,
        evidence={
            "rank": s.rank,
            "host": s.host,
            "cause": s.cause,
            "cost_ms": round(s.cost_s * 1e3, 3),
            "compared_with": s.compared_with,
            "periodic": s.periodic,
            "gap_ms": {k: round(v * 1e3, 3) for k, v in s.gap_s.items()},
        },
    )
    # The gain is read from the other ranks' waiting time, not timed with a fix applied.
    finding.set_gain(s.cost_share, measured=False)
    if s.cause == "cpu_contention":
        finding.evidence["cpu_wait_ms"] = round((s.contention_s or 0.0) * 1e3, 3)
        finding.cap(
            "low",
            f"Rank {s.rank} used {(s.cpu_gap_s or 0.0) * 1e3:+.1f} ms of CPU per step against rank "
            f"{s.compared_with} and waited {(s.contention_s or 0.0) * 1e3:+.1f} ms more for a core: the "
            "machine's load, not the script; it goes away on cores of its own.",
        )
    cap_if_oversubscribed(ctx, finding)
    if s.cause == "outside_step":
        _time_rarer_saves(ctx, job, s, finding)
        if finding.request is None:
            _time_rarer_branch(ctx, job, s, finding)
    elif s.cause == "data_loading":
        _time_more_workers(ctx, job, s, finding)
    yield finding


def _own_recording(ctx: Context, s: Straggler) -> Recording | None:
    """The straggler's own recording, among the job's."""
    ranks = ctx.recording.job if ctx.recording is not None else ()
    return next((r for r in ranks if r.rank == s.rank), None)


def _time_rarer_saves(ctx: Context, job: RankAnalysis, s: Straggler, finding: Finding) -> None:
    """A straggler late from its own torch.save at one line: time the save every N steps on every rank, N the
    cadence at which the save costs under 5% of the step."""
    recording = _own_recording(ctx, s)
    if s.site is None or recording is None:
        return
    count, seconds, _ = next(
        (e.total(job.steps) for e in recording.events if e.kind == "save" and e.site == s.site), (0, 0.0, 0)
    )
    if count != len(job.steps):  # one save per step: the edit's ``if (step + 1) % N == 0:`` fits it
        return
    per_save = seconds / count
    step = max(r.step_s for r in job.ranks)
    every = max(2, suggested_every(per_save, max(step - per_save, 1e-6), 1))
    finding.evidence["save_every"] = every
    finding.request = JobRequest(RankChange(save_every=every, save_at=f"{s.site.file}:{s.site.line}"))
    finding.fix = Fix(
        pytorch=f"Save rank {s.rank}'s checkpoint every {every} steps, not every step (`if (step + 1) % {every} == "
        "0:` around torch.save), or write it from a background thread after copying the state to CPU: the "
        "others wait for it at the next all-reduce."
    )


def _time_rarer_branch(ctx: Context, job: RankAnalysis, s: Straggler, finding: Finding) -> None:
    """A straggler late from work an ``if`` of the script's loop runs (``if rank == 0 and step % 2 == 0:
    evaluate()``): time that ``if`` taken on one pass in N on every rank, N the factor that puts the work under 5%
    of the step, as the same test with a period N times longer would."""
    if s.site is None or ctx.script is None:
        return
    branch = branch_running(ctx.sources, s.site)
    if branch is None or branch.site.file != ctx.script:
        return
    # The work's cost each time it runs: the others' wait averaged over the steps it was late in.
    per_run = s.cost_s / max(s.last_share, 1e-9)
    period = branch.period or max(1, round(1 / max(s.last_share, 1e-9)))
    step = s.cost_s / s.cost_share if s.cost_share > 0 else max(r.step_s for r in job.ranks)
    new_period = suggested_every(per_run, max(step - s.cost_s, 1e-6), period)
    every = max(2, new_period // period)
    finding.evidence["branch"] = {
        "at": branch.site.where(),
        "file": branch.site.file,
        "period": branch.period,
        "new_period": period * every,
        "call": branch.call,
        "call_line": branch.call_line,
    }
    finding.request = JobRequest(RankChange(branch_every=every, branch_at=f"{branch.site.file}:{branch.site.line}"))
    was = f"every {period} steps (the period in its `if`)" if branch.period else "every step"
    finding.fix = Fix(
        pytorch=f"Run rank {s.rank}'s work at {branch.site.where(ctx.base)} every {period * every} steps, not "
        f"{was}, or share it over every rank (each evaluating its slice): the others wait for it at the next "
        "all-reduce."
    )


# Worker processes per rank the data what-if asks for at most.
MAX_WORKERS = 8


def _time_more_workers(ctx: Context, job: RankAnalysis, s: Straggler, finding: Finding) -> None:
    """A straggler late from its DataLoader at one line: time every rank's DataLoaders with enough worker processes
    to fetch a batch in the time the median rank works a step (map-style datasets only)."""
    recording = _own_recording(ctx, s)
    loader = next((lo for lo in recording.loaders if lo.site == s.site), None) if recording is not None else None
    if loader is None or loader.settings.get("iterable"):
        return
    count, waited, _ = loader.nexts.total(job.steps)
    # The pace to keep: the median rank's own work per step, without its wait for the straggler.
    pace = next((r.busy_s for r in job.ranks if r.rank == s.compared_with), 0.0)
    if count == 0 or pace <= 0:
        return
    now, per_batch = int(loader.settings.get("num_workers") or 0), waited / count
    # A batch every ``pace`` seconds from workers that each take the wait a batch has now, and one to spare.
    workers = min(MAX_WORKERS, max(2 * now, math.ceil(per_batch / pace) + 1))
    if workers <= now:
        return
    finding.evidence["num_workers"] = {"now": now, "timed": workers}
    finding.request = JobRequest(RankChange(loader_workers=workers))
    finding.fix = Fix(
        pytorch=f"DataLoader(..., num_workers={workers}, persistent_workers=True) on every rank: rank {s.rank} waits "
        f"{1e3 * per_batch:.1f} ms for each batch, and workers fetch the next ones while it trains; then give "
        "its shard storage as fast as the others'.",
        lightning=f"DataLoader(..., num_workers={workers}, persistent_workers=True) in the DataModule",
    )


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
        by.evidence.setdefault("absorbed", []).append(f.rule)
        for framework in ("lightning", "fabric", "accelerate", "hf_trainer"):  # its fix in the user's framework
            if getattr(by.fix, framework) is None:
                setattr(by.fix, framework, getattr(f.fix, framework))
    return out


RULE = register(Rule("straggler", detect=(Detect("runtime", straggler),), edit=rank_change_edit))
