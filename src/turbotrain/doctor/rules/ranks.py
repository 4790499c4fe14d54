"""Rules on a multi-process job's ranks side by side (the recordings the doctor gathered from every rank)."""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any, Iterator

from ..analysis.branch import branch_running
from ..analysis.periodic import suggested_every
from ..analysis.ranks import CONSISTENT, RankAnalysis, Straggler, analyse_ranks, oversubscribed
from ..findings import Finding, Fix
from ..rank_change import RankChange
from ..requests import JobRequest
from ..sites import Site
from .registry import rule

if TYPE_CHECKING:
    from ..analysis.context import Context
    from ..record.recording import Recording

__all__ = [
    "straggler",
    "uneven_work",
    "exposed_gradient_sync",
    "ddp_find_unused_parameters",
    "ddp_static_graph",
    "ddp_bucket_settings",
    "on_a_job",
    "call_site",
    "absorbed_by_straggler",
]

_CAUSE_WORDS = {
    "data_loading": "its data loading",
    "host_to_device": "its host-to-device copies",
    "compute": "its compute (forward and backward)",
    "optimizer": "its optimizer step",
    "host_sync": "its host syncs",
    "outside_step": "work only it does between steps",
    "unexplained": "time no phase explains",
    "cpu_contention": "waiting for a CPU (its thread used no more CPU time than the others': other "
    "processes or the hypervisor held its core)",
}

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


def on_a_job(ctx: Context) -> bool:
    """The recording is one rank's of a multi-process job the doctor gathered (two or more ranks)."""
    return ctx.recording is not None and len(ctx.recording.job) >= 2


def call_site(ctx: Context, name: str, keyword: str | None = None) -> Site | None:
    """The first call to ``name`` in the user's sources (with ``keyword`` among its arguments, if given)."""
    for index in ctx.sources.values():
        for call, _ in index.calls(name):
            if keyword is None or any(k.arg == keyword for k in call.keywords):
                return index.site(call)
    return None


def _cap_if_oversubscribed(ctx: Context, finding: Finding) -> None:
    """On cores the ranks oversubscribe, which rank is late is the scheduler's choice as much as the script's."""
    recording = ctx.recording
    if recording is None or ctx.on_gpu or not ctx.machine:
        return
    usable = ctx.machine.get("usable_cores") or 1
    found = oversubscribed(recording, usable)
    if found is not None:
        finding.cap(
            "low",
            f"The ranks on {recording.host or 'this host'} run {sum(found[0])} threads on {usable} usable core(s) "
            "(cpu-oversubscribed): which rank is late is the scheduler's choice as much as the script's. Fix the "
            "threads first, then see which rank is still late.",
        )


def _job(ctx: Context) -> RankAnalysis | None:
    """Every rank side by side, on a job of two or more recorded ranks (else None)."""
    recording = ctx.recording
    return analyse_ranks(recording.job) if recording is not None and len(recording.job) >= 2 else None


@rule("straggler", "runtime")
def straggler(ctx: Context) -> Iterator[Finding]:
    job = _job(ctx)
    if job is None or job.straggler is None:
        return
    s = job.straggler
    cause = _CAUSE_WORDS.get(s.cause, s.cause)
    gap = s.gap_s.get(s.cause)
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
    _cap_if_oversubscribed(ctx, finding)
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


@rule("uneven-work", "runtime")
def uneven_work(ctx: Context) -> Iterator[Finding]:
    """No rank is late every step, yet each step waits for whichever rank got more work."""
    job = _job(ctx)
    if job is None or job.imbalance is None:
        return
    u = job.imbalance
    sized = u.larger_input_share >= CONSISTENT  # the late rank had the larger batch: the evidence of uneven work
    turns = ", ".join(f"rank {rank} in {share:.0%}" for rank, share in sorted(u.last_shares.items()))
    why = (
        ", and no phase of the last one explains it"
        if u.cause == "unexplained"
        else f", and the last one's {_CAUSE_WORDS.get(u.cause, u.cause).removeprefix('its ')} took "
        f"{u.cause_gap_s * 1e3:.1f} ms more than the first one's, and its batch was the larger one in "
        f"{u.larger_input_share:.0%} of the steps"
    )
    finding = Finding(
        rule="uneven-work",
        message=(
            f"No single rank is late, yet every step waits for one: the rank that arrived first at the gradient "
            f"all-reduce waited {u.first_wait_s * 1e3:.1f} ms per step on average for the one that arrived last. "
            f"The ranks were last in turns ({turns}){why}. Evened out, each step would take the ranks' mean "
            f"work: {u.cost_s * 1e3:.1f} ms ({u.cost_share:.0%} of the step) less."
        ),
        fix=Fix(pytorch=_UNEVEN_FIXES.get(u.cause, _UNEVEN_FIXES["compute"]) if sized else _SAME_SIZE_FIX),
        category=u.cause,
        evidence={
            "cost_ms": round(u.cost_s * 1e3, 3),
            "first_wait_ms": round(u.first_wait_s * 1e3, 3),
            "last_shares": {str(k): round(v, 3) for k, v in u.last_shares.items()},
            "cause": u.cause,
            "cause_gap_ms": round(u.cause_gap_s * 1e3, 3),
            "cpu_gap_ms": round(u.cpu_gap_s * 1e3, 3) if u.cpu_gap_s is not None else None,
            "larger_input_share": round(u.larger_input_share, 3),
        },
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
    # (a wait for a core, a slower step now and then), and more so on a loaded machine.
    elif not sized:
        finding.cap(
            "low",
            f"The last rank's batch was the larger one in only {u.larger_input_share:.0%} of the steps: a wait for a "
            "core or step-to-step noise explains the turns as well as uneven work does.",
        )
    _cap_if_oversubscribed(ctx, finding)
    yield finding


# Exposed gradient synchronization worth a line of its own: a quarter of the step.
EXPOSED_SHARE = 0.25


_FSDP_FIX = Fix(
    pytorch="Communicate less per sample: a larger batch per rank (rescale the learning rate); "
    "fully_shard(module, reshard_after_forward=False), or FullyShardedDataParallel(..., "
    "sharding_strategy=ShardingStrategy.SHARD_GRAD_OP), keeps the gathered parameters from forward to backward "
    "(one all-gather a step instead of two, more memory); or DDP when the model and its optimizer state fit on "
    "each rank (one all-reduce, overlapped with backward)",
    lightning='Trainer(strategy=FSDPStrategy(sharding_strategy="SHARD_GRAD_OP"))',
    fabric='Fabric(strategy=FSDPStrategy(sharding_strategy="SHARD_GRAD_OP"))',
    accelerate="FullyShardedDataParallelPlugin(reshard_after_forward=False) (fsdp_reshard_after_forward: false "
    "in the accelerate config; SHARD_GRAD_OP as the sharding strategy with FSDP1)",
    hf_trainer='TrainingArguments(fsdp="shard_grad_op")',
)
_EXPOSED_FIXES = {
    "ddp": "Synchronize less often: a larger batch per rank (rescale the learning rate), or accumulate k "
    "micro-batches under `with model.no_sync():` and all-reduce on the last one",
    "collectives": "Synchronize less often: a larger batch per rank, or accumulate several micro-batches before "
    "the collective; DistributedDataParallel overlaps the gradient all-reduce with backward, a loop that calls "
    "dist.all_reduce itself after backward overlaps nothing",
}


def _exposed_message(job: RankAnalysis) -> str:
    if job.sync_kind == "ddp":
        overlap = f"{job.overlap:.0%}" if job.overlap is not None else "none"
        return (
            f"{job.exposed_share:.0%} of every rank's step waits on the gradient all-reduce after its own "
            f"backward ({overlap} of the all-reduce ran while backward still computed), and no rank is late: "
            "each step synchronizes the whole model's gradients for little compute."
        )
    what = (
        "parameters gathered before each sharded module's forward and backward, gradients scattered after"
        if job.sync_kind == "fsdp"
        else "calls to torch.distributed that block until every rank is there"
    )
    return (
        f"{job.exposed_share:.0%} of every rank's step waits in {job.waited_on} ({what}), and no rank is late: "
        "on CPU tensors each call blocks the step until it completes, so none of it overlaps compute."
    )


@rule("exposed-gradient-sync", "runtime")
def exposed_gradient_sync(ctx: Context) -> Iterator[Finding]:
    """Every rank waits on its synchronization (DDP's all-reduce after its own backward, FSDP's blocking
    all-gathers and reduce-scatters), and no straggler explains the wait."""
    job = _job(ctx)
    if job is None or job.straggler is not None or job.imbalance is not None or job.exposed_share < EXPOSED_SHARE:
        return
    finding = Finding(
        rule="exposed-gradient-sync",
        message=_exposed_message(job),
        fix=_FSDP_FIX if job.sync_kind == "fsdp" else Fix(pytorch=_EXPOSED_FIXES[job.sync_kind]),
        category=None,
        evidence={"exposed_share": round(job.exposed_share, 4), "overlap": job.overlap, "kind": job.sync_kind},
    )
    finding.set_gain(job.exposed_share, measured=False)
    reshard = _unset_reshard_site(ctx) if job.sync_kind == "fsdp" else None
    if reshard is not None:
        # One all-gather per sharded module a step instead of two: timed on every rank, the site is --fix's.
        finding.site = reshard
        finding.evidence["keywords"] = {"reshard_after_forward": False}
        finding.provisional("low")
        finding.request = JobRequest(RankChange(fsdp={"reshard_after_forward": False}))
    else:
        # The share is measured; what a larger batch or accumulation buys is not timed on a job.
        finding.cap("low", "The waiting is measured on every rank; the fix is not timed on several processes yet.")
    yield finding


# The keyword of each FSDP that decides whether parameters are gathered again for backward.
_RESHARD_KEYWORD = {
    "fully_shard": "reshard_after_forward",
    "FullyShardedDataParallel": "sharding_strategy",
    "FSDP": "sharding_strategy",
}


def _unset_reshard_site(ctx: Context) -> Site | None:
    """The script's first FSDP call (``fully_shard`` or ``FullyShardedDataParallel``) that leaves resharding after
    forward to FSDP (None: every call decides it, or the sharding is a library's)."""
    for name, keyword in _RESHARD_KEYWORD.items():  # fully_shard's first: a script with both runs either
        sites = [
            index.site(call)
            for index in ctx.sources.values()
            for call, _ in index.calls(name)
            if not any(k.arg == keyword for k in call.keywords)
        ]
        if sites:
            return min(sites, key=lambda site: (site.file, site.line))
    return None


@rule("ddp-find-unused-parameters", "runtime")
def ddp_find_unused_parameters(ctx: Context) -> Iterator[Finding]:
    """DDP built with ``find_unused_parameters=True`` while its reducer found every parameter used."""
    stats = _reducers(ctx)
    if not stats or not all(s["find_unused_parameters"] and s.get("unused_parameter_size", 1.0) == 0 for s in stats):
        return
    finding = Finding(
        rule="ddp-find-unused-parameters",
        site=call_site(ctx, "DistributedDataParallel", "find_unused_parameters"),
        category="compute",
        message=(
            "DistributedDataParallel was built with find_unused_parameters=True, and its reducer found no unused "
            "parameter: after every forward it walks the whole autograd graph looking for them, and it cannot "
            "start any all-reduce before the backward has visited every parameter."
        ),
        fix=Fix(
            "DistributedDataParallel(model, ...) without find_unused_parameters=True (False is the default)",
            lightning='Trainer(strategy="ddp"), not "ddp_find_unused_parameters_true"',
            fabric='Fabric(strategy="ddp"), not "ddp_find_unused_parameters_true"',
            accelerate="no DistributedDataParallelKwargs(find_unused_parameters=True) in kwargs_handlers",
            hf_trainer="TrainingArguments(ddp_find_unused_parameters=False)",
        ),
        evidence={"ranks": len(stats), "unused_parameter_size": 0},
    )
    finding.provisional("low")  # until a job what-if times it on every rank
    if on_a_job(ctx):
        finding.request = JobRequest(RankChange(ddp={"find_unused_parameters": False}))
    else:
        finding.note = (
            "One process: the flag's cost is timed on a multi-process job (turbotrain doctor --nproc-per-node)."
        )
    yield finding


def _reducers(ctx: Context) -> list[dict[str, float]]:
    """DDP's reducer statistics and settings on every rank (the one process's off a job); empty without DDP."""
    recording = ctx.recording
    if recording is None:
        return []
    return [r.reducer for r in (recording.job or (recording,)) if "find_unused_parameters" in r.reducer]


# What ddp-static-graph times: the graph declared static, and DDP no longer told to look for unused parameters
# (static_graph finds them in its first iteration; with both set, DDP warns that the search is not needed).
_STATIC_GRAPH = {"static_graph": True, "find_unused_parameters": False}


@rule("ddp-static-graph", "runtime")
def ddp_static_graph(ctx: Context) -> Iterator[Finding]:
    """DDP looks for unused parameters after every forward, and each rank finds the same ones at every iteration."""
    stats = _reducers(ctx)
    if not stats or not all(
        s["find_unused_parameters"]
        and s.get("unused_parameter_size", 0.0) > 0
        and s.get("graph_static") == 1.0
        and not s.get("static_graph")
        for s in stats
    ):
        return
    unused_mib = max(s["unused_parameter_size"] for s in stats) / _MIB
    keywords = ", ".join(f"{k}={v!r}" for k, v in _STATIC_GRAPH.items())
    finding = Finding(
        rule="ddp-static-graph",
        site=call_site(ctx, "DistributedDataParallel", "find_unused_parameters")
        or call_site(ctx, "DistributedDataParallel"),
        category="compute",
        message=(
            "DistributedDataParallel looks for unused parameters after every forward (find_unused_parameters=True), "
            f"and each rank found the same ones at every iteration of this run ({unused_mib:.2f} MiB of parameters "
            "no loss uses): the graph is static. With static_graph=True DDP finds them in its first iteration, "
            "then stops walking the autograd graph and all-reducing its map of used parameters every step, and "
            "rebuilds its buckets in the order gradients arrive. Should the graph change after all, DDP raises an "
            "error on the rank where it changed (the others wait for it until the collective's timeout)."
        ),
        fix=Fix(
            f"DistributedDataParallel(model, ..., {keywords})",
            lightning=f"Trainer(strategy=DDPStrategy({keywords}))",
            fabric=f"Fabric(strategy=DDPStrategy({keywords}))",
            accelerate=f"Accelerator(kwargs_handlers=[DistributedDataParallelKwargs({keywords})])",
        ),
        evidence={"ranks": len(stats), "unused_parameter_mib": round(unused_mib, 3), "keywords": _STATIC_GRAPH},
    )
    finding.provisional("low")  # until a job what-if times it on every rank
    if on_a_job(ctx):
        finding.request = JobRequest(RankChange(ddp=dict(_STATIC_GRAPH)))
    else:
        finding.note = "One process: static_graph is timed on a multi-process job (turbotrain doctor --nproc-per-node)."
    yield finding


# Exposed all-reduce worth timing DDP's bucket settings for; a model this large is spread over BUCKETS buckets.
BUCKET_SETTINGS_SHARE = 0.10
BUCKETS = 4
_MIB = 1 << 20


def _bucket_change(reducer: dict[str, float]) -> dict[str, Any]:
    """The DDP keywords to time: gradients as views of the buckets (no copy into them), and a bucket size that
    spreads a model of 4 MiB or more over BUCKETS buckets, so the first all-reduces start while backward runs.
    A bucket holds whole tensors: a model of few tensors keeps its buckets whatever the size, so it gets none."""
    change: dict[str, Any] = {}
    if not reducer.get("gradient_as_bucket_view"):
        change["gradient_as_bucket_view"] = True
    size = reducer.get("total_parameter_size_bytes") or 0.0
    tensors = reducer.get("num_parameter_tensors") or 0.0
    if size >= BUCKETS * _MIB and tensors >= 2 * BUCKETS and (reducer.get("buckets") or 1) < BUCKETS:
        change["bucket_cap_mb"] = max(1, int(size / BUCKETS / _MIB))
    return change


def _what_defaults_cost(change: dict[str, Any]) -> str:
    parts = []
    if "gradient_as_bucket_view" in change:
        parts.append("it copies each gradient into its bucket")
    if "bucket_cap_mb" in change:
        parts.append("it all-reduces a bucket only when every gradient in it is ready, and its buckets are few")
    return "; ".join(parts)


@rule("ddp-bucket-settings", "runtime")
def ddp_bucket_settings(ctx: Context) -> Iterator[Finding]:
    """Even the rank that arrives last waits on the all-reduce, and DDP runs with its default buckets."""
    job = _job(ctx)
    recording = ctx.recording
    if recording is None or job is None or not recording.reducer:
        return
    step = statistics.median(r.step_s for r in job.ranks)
    # The least any rank waited in a step is the all-reduce's own exposed time: no rank's lateness is in it.
    shared = job.shared_wait_s / step if step > 0 else 0.0
    if shared < BUCKET_SETTINGS_SHARE:
        return
    change = _bucket_change(recording.reducer)
    if not change:
        return
    keywords = ", ".join(f"{k}={v!r}" for k, v in change.items())
    size = (recording.reducer.get("total_parameter_size_bytes") or 0.0) / _MIB
    buckets = int(recording.reducer.get("buckets") or 0)
    layout = f"{size:.1f} MiB of gradients in {buckets} bucket(s)" if buckets else f"{size:.1f} MiB of gradients"
    finding = Finding(
        rule="ddp-bucket-settings",
        site=call_site(ctx, "DistributedDataParallel"),
        category=None,
        message=(
            f"Even the rank that arrives last waits {shared:.0%} of the step on the gradient all-reduce, and DDP "
            f"runs with its defaults ({layout}): {_what_defaults_cost(change)}. Timed on every rank: "
            f"DistributedDataParallel(..., {keywords})."
        ),
        fix=Fix(
            f"DistributedDataParallel(model, ..., {keywords})",
            lightning=f"Trainer(strategy=DDPStrategy({keywords}))",
            fabric=f"Fabric(strategy=DDPStrategy({keywords}))",
            accelerate=f"Accelerator(kwargs_handlers=[DistributedDataParallelKwargs({keywords})])",
            hf_trainer=(
                f"TrainingArguments(ddp_bucket_cap_mb={change['bucket_cap_mb']})" if "bucket_cap_mb" in change else None
            ),
        ),
        evidence={
            "shared_wait_share": round(shared, 4),
            "exposed_share": round(job.exposed_share, 4),
            "overlap": job.overlap,
            "gradient_mib": round(size, 2),
            "buckets": buckets or None,
            "keywords": change,
        },
    )
    finding.provisional("low")  # until the job what-if times it on every rank
    finding.request = JobRequest(RankChange(ddp=change))
    yield finding
