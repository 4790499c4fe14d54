"""`exposed-gradient-sync`: on a multi-process job, a quarter or more of every rank's step waiting on the gradient
all-reduce after its own backward, or in FSDP's blocking all-gathers and reduce-scatters, beyond what a straggler or
uneven work shown explains (where one is named, the wait every rank has must be that quarter: ranks late in turns
with batches of one size are noise); under `fully_shard` with `reshard_after_forward` left to FSDP,
`reshard_after_forward=False` is timed on every rank and patched into every call; otherwise `low` (a larger batch is
not timed).

Reads: every rank's run.
Applies to: a multi-process job.
Edit: under FSDP, `reshard_after_forward=False` in every `fully_shard(...)` call that leaves it to FSDP (timed on
every rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from ...analysis.ranks import RankAnalysis
from ...findings import Evidence, Finding, Fix
from ...rank_change import RankChange
from ...requests import JobRequest
from ...sites import Site
from ..common import rank_change_edit
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


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


@dataclass(frozen=True)
class ExposedEvidence(Evidence):
    exposed_share: float
    overlap: float | None  # of DDP's all-reduces, the share that ran while backward computed
    kind: str  # a key of analysis.ranks.WAITED_ON
    keywords: dict[str, Any] | None = None  # the fully_shard keywords timed, where they are


def _exposed_message(job: RankAnalysis, late: bool) -> str:
    no_late = (
        f"and {job.shared_wait_s / job.step_s:.0%} of the step is the wait every rank has, whoever is late"
        if late
        else "and no rank is late"
    )
    if job.sync_kind == "ddp":
        overlap = f"{job.overlap:.0%}" if job.overlap is not None else "none"
        return (
            f"{job.exposed_share:.0%} of every rank's step waits on the gradient all-reduce after its own "
            f"backward ({overlap} of the all-reduce ran while backward still computed), {no_late}: "
            "each step synchronizes the whole model's gradients for little compute."
        )
    what = (
        "parameters gathered before each sharded module's forward and backward, gradients scattered after"
        if job.sync_kind == "fsdp"
        else "calls to torch.distributed that block until every rank is there"
    )
    return (
        f"{job.exposed_share:.0%} of every rank's step waits in {job.waited_on} ({what}), {no_late}: "
        "on CPU tensors each call blocks the step until it completes, so none of it overlaps compute."
    )


def exposed_gradient_sync(ctx: Context) -> Iterator[Finding]:
    """Every rank waits on its synchronization (DDP's all-reduce after its own backward, FSDP's blocking
    all-gathers and reduce-scatters), beyond what a late rank explains."""
    job = ctx.job
    # Turns that uneven work explains are the wait's cause; turns from noise (batches of one size) are not, and
    # the wait that every rank has stays this finding's (seen on a balanced FSDP job: 55% exposed, turns by chance).
    if job is None or job.exposed_share < EXPOSED_SHARE:
        return
    late = job.straggler is not None or (job.imbalance is not None and job.imbalance.evidenced)
    # A late rank explains the others' wait for it, not the wait every rank has (the least any rank waited): where
    # that is a quarter of the step it stays this finding's (a 7% contention straggler beside a 57% FSDP wait).
    if late and job.shared_wait_s < EXPOSED_SHARE * job.step_s:
        return
    reshard = _unset_reshard_site(ctx) if job.sync_kind == "fsdp" else None
    finding = Finding(
        rule="exposed-gradient-sync",
        message=_exposed_message(job, late),
        fix=_FSDP_FIX if job.sync_kind == "fsdp" else Fix(pytorch=_EXPOSED_FIXES[job.sync_kind]),
        category=None,
        evidence=ExposedEvidence(
            exposed_share=round(job.exposed_share, 4),
            overlap=job.overlap,
            kind=job.sync_kind,
            keywords={"reshard_after_forward": False} if reshard is not None else None,
        ),
    )
    finding.set_gain(job.exposed_share, measured=False)
    if reshard is not None:
        # One all-gather per sharded module a step instead of two: timed on every rank, the site is --fix's.
        finding.site = reshard
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


RULE = register(
    Rule("exposed-gradient-sync", detect=(Detect("runtime", exposed_gradient_sync),), edit=rank_change_edit)
)
