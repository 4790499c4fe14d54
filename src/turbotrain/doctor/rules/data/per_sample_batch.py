"""`per-sample-batch`: a batch built one sample at a time (a list comprehension of slices, per-row `torch.tensor`,
stacked) at a line the step waited on (one-op build timed on your data).

Reads: run, source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...analysis.batch_building import per_sample_build
from ...findings import Evidence, Finding, Fix
from ...requests import BatchBuildRequest
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...sites import Site


# Data loading under this share of the step: the batch is not what the step waits on.
DATA_SHARE = 0.10


# A line holding less of the data wait than this is not worth its own finding.
LINE_SHARE = 0.02


@dataclass(frozen=True)
class PerSampleEvidence(Evidence):
    samples_at_line: int  # the sampler's catches at the line, of
    samples_in_gaps: int  # its catches before the forward
    line_share: float
    ms_per_step: float
    pattern: str  # "slices" or "rows" (analysis/batch_building.py)


def per_sample_batch(ctx: Context) -> Iterator[Finding]:
    share = ctx.share("data_loading")
    total = sum(ctx.gap_samples.values())
    if share < DATA_SHARE or not total:
        return
    data_s = ctx.seconds("data_loading")
    # One line, whichever frame was caught on it (the comprehension's own, or its function's during the stack).
    by_line: dict[tuple[str, int], tuple[Site, int]] = {}
    for site, count in ctx.gap_samples.items():
        kept, seen = by_line.get((site.file, site.line), (site, 0))
        by_line[(site.file, site.line)] = (kept if seen else site, seen + count)
    for site, count in sorted(by_line.values(), key=lambda kv: -kv[1]):
        build = per_sample_build(site)
        line_share = share * count / total
        if build is None or line_share < LINE_SHARE:
            continue
        per_step_s = data_s * count / total
        leads = ctx.breakdown.bottleneck == "data_loading"
        f = Finding(
            "per-sample-batch",
            site=site,
            category="data_loading",
            message=(
                f"The batch is built here one sample at a time, {build.call}([{build.element} for {build.var} "
                f"in {build.indices}]): one indexing op, one tensor and one Python iteration per sample. "
                f"About {line_share:.0%} of each step ({per_step_s * 1e3:.1f} ms) waits on this line"
                + (", and data loading leads the step." if leads else ".")
            ),
            fix=Fix(f"build the batch with one indexing op: {build.one_op()}"),
            evidence=PerSampleEvidence(
                samples_at_line=count,
                samples_in_gaps=total,
                line_share=round(line_share, 4),
                ms_per_step=round(per_step_s * 1e3, 3),
                pattern=build.kind,
            ),
            request=BatchBuildRequest(site, line_share) if build.kind == "slices" else None,
        )
        f.set_gain(line_share, measured=False)
        f.note = (
            "est_speedup is the upper bound (all of this line's measured time) until the one-op build is timed."
            if build.kind == "slices"
            else "Not timed: the samples are not slices of one tensor, so the one-op build cannot be made "
            "from your data without changing it; the share above is what the line measured."
        )
        yield f


RULE = register(Rule("per-sample-batch", detect=(Detect("runtime", per_sample_batch),)))
