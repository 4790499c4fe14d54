"""`ddp-bucket-settings`: on a multi-process job, even the rank that arrives last at the gradient all-reduce waiting a
tenth of the step or more there (the least any rank waited, per step: no rank's lateness is in it; `shared_wait_ms`
in the JSON's `communication`), while DDP keeps a default the script could change: `gradient_as_bucket_view=True`
(no copy of each gradient into its bucket) and, for 4 MiB of gradients or more in fewer than 4 buckets,
`bucket_cap_mb` of a quarter of them (the first all-reduces start while backward runs); `low` until timed on every
rank.

Reads: every rank's run.
Applies to: a multi-process job.
Edit: the bucket keywords timed on every rank (`bucket_cap_mb`, `gradient_as_bucket_view`) in the
`DistributedDataParallel(...)` call.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from ...findings import Evidence, Finding, Fix
from ...rank_change import RankChange
from ...requests import JobRequest
from ..common import MIB, call_site, rank_change_edit
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


# Exposed all-reduce worth timing DDP's bucket settings for; a model this large is spread over BUCKETS buckets.
BUCKET_SETTINGS_SHARE = 0.10


BUCKETS = 4


@dataclass(frozen=True)
class BucketEvidence(Evidence):
    shared_wait_share: float  # of the step, the least any rank waited on the all-reduce
    exposed_share: float
    overlap: float | None
    gradient_mib: float
    buckets: int | None  # None: not known
    keywords: dict[str, Any]  # the DDP keywords timed


def _bucket_change(reducer: dict[str, float]) -> dict[str, Any]:
    """The DDP keywords to time: gradients as views of the buckets (no copy into them), and a bucket size that
    spreads a model of 4 MiB or more over BUCKETS buckets, so the first all-reduces start while backward runs.
    A bucket holds whole tensors: a model of few tensors keeps its buckets whatever the size, so it gets none."""
    change: dict[str, Any] = {}
    if not reducer.get("gradient_as_bucket_view"):
        change["gradient_as_bucket_view"] = True
    size = reducer.get("total_parameter_size_bytes") or 0.0
    tensors = reducer.get("num_parameter_tensors") or 0.0
    if size >= BUCKETS * MIB and tensors >= 2 * BUCKETS and (reducer.get("buckets") or 1) < BUCKETS:
        change["bucket_cap_mb"] = max(1, int(size / BUCKETS / MIB))
    return change


def _what_defaults_cost(change: dict[str, Any]) -> str:
    parts = []
    if "gradient_as_bucket_view" in change:
        parts.append("it copies each gradient into its bucket")
    if "bucket_cap_mb" in change:
        parts.append("it all-reduces a bucket only when every gradient in it is ready, and its buckets are few")
    return "; ".join(parts)


def ddp_bucket_settings(ctx: Context) -> Iterator[Finding]:
    """Even the rank that arrives last waits on the all-reduce, and DDP runs with its default buckets."""
    job = ctx.job
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
    size = (recording.reducer.get("total_parameter_size_bytes") or 0.0) / MIB
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
        evidence=BucketEvidence(
            shared_wait_share=round(shared, 4),
            exposed_share=round(job.exposed_share, 4),
            overlap=job.overlap,
            gradient_mib=round(size, 2),
            buckets=buckets or None,
            keywords=change,
        ),
    )
    finding.provisional("low")  # until the job what-if times it on every rank
    finding.request = JobRequest(RankChange(ddp=change))
    yield finding


RULE = register(Rule("ddp-bucket-settings", detect=(Detect("runtime", ddp_bucket_settings),), edit=rank_change_edit))
