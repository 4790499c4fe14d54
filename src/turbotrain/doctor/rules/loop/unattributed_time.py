"""`unattributed-time`: a phase over 10% of the step besides the step's own work (data, copies, syncs, outside the
step) that no other finding ties to a line: the best line known and why nothing finer was found.

Reads: run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...findings import Evidence, Finding, Fix
from ..common import ATTRIBUTED_SHARE, ms
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...record.measurements import Category
    from ...sites import Site


# The training step's own work: the model's forward and backward, their dispatch (jit-script's) and the update
# (timed inside optimizer.step(), whose line the breakdown names).
_OWN_WORK: tuple[Category, ...] = ("compute", "python_overhead", "optimizer")


_GAP_SAMPLED_FROM_S = 1e-3  # the recorder samples untimed batch building from a millisecond a step


@dataclass(frozen=True)
class UnattributedEvidence(Evidence):
    share: float
    ms_per_step: float


def _why_data(ctx: Context) -> tuple[Site | None, str]:
    record = ctx.main_loader
    if record is not None:
        return record.site, "the step waits on this DataLoader"
    gap = ctx.seconds("data_loading")
    site = ctx.capture.site if ctx.capture is not None else None
    if ctx.gap_samples:
        busiest = max(ctx.gap_samples.items(), key=lambda kv: kv[1])[0]
        return busiest, (
            "this line was caught running most often in the untimed time before the step's forward "
            "(which is charged to data loading), and no rule has a fix for it"
        )
    if gap < _GAP_SAMPLED_FROM_S:
        why = (
            f"each step spends {ms(gap)} before this forward with no timed call (building the batch in the "
            "loop: indexing, random draws), under the millisecond from which the doctor samples which line "
            "runs there"
        )
    else:
        why = (
            "the time before this forward ran in no timed call and the sampler caught no line of yours in it "
            "(it ran in a library's code)"
        )
    return site, why


def _why(ctx: Context, category: Category) -> tuple[Site | None, str]:
    """The best line the run knows for ``category``'s time, and why nothing finer was found."""
    if category == "data_loading":
        return _why_data(ctx)
    kinds = {
        "outside_step": ("eval_forward", "eval_grad_forward", "save"),
        "host_sync": ("sync:",),
        "host_to_device": ("h2d",),
    }.get(category, ())
    for kind in kinds:
        stats = ctx.ran_sites(kind)
        if stats:
            return stats[0].site, "the time is the calls at this line and its like"
    return None, "no call of your code was timed in it (the time ran between the hooks the doctor installs)"


def unattributed_time(ctx: Context) -> Iterator[Finding]:
    if not ctx.step_s:
        return
    for category, share in sorted(ctx.breakdown.shares.items(), key=lambda kv: -kv[1]):
        if category in _OWN_WORK or share < ATTRIBUTED_SHARE:
            continue
        site, why = _why(ctx, category)
        label = category.replace("_", " ")
        f = Finding(
            "unattributed-time",
            site=site,
            category=category,
            message=(
                f"{share:.0%} of each step ({ms(ctx.seconds(category))}) is {label} that no finding explains: {why}."
            ),
            fix=Fix(
                "no measured fix: look at the line above, or run with --trace and open the trace to see what runs there"
            ),
            evidence=UnattributedEvidence(share=round(share, 4), ms_per_step=round(ctx.seconds(category) * 1e3, 3)),
        )
        f.provisional("low")
        yield f


def explained(findings: list[Finding]) -> list[Finding]:
    """``unattributed-time`` findings less those whose phase another finding already ties to a line."""
    covered = {
        f.category
        for f in findings
        if f.rule != "unattributed-time" and f.source != "static" and (f.site is not None or f.where)
    }
    return [f for f in findings if f.rule != "unattributed-time" or f.category not in covered]


RULE = register(Rule("unattributed-time", detect=(Detect("runtime", unattributed_time),)))
