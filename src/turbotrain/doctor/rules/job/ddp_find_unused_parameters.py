"""`ddp-find-unused-parameters`: DDP built with `find_unused_parameters=True` while its reducer found no unused
parameter (on a job: the flag off, timed on every rank).

Reads: every rank's run.
Applies to: a multi-process job.
Edit: `find_unused_parameters=False` in the `DistributedDataParallel(...)` call, where the literal `True` is (timed
on every rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...findings import Evidence, Finding, Fix
from ...rank_change import RankChange
from ...requests import JobRequest
from ..common import call_site, on_a_job, rank_change_edit, reducers
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class UnusedEvidence(Evidence):
    ranks: int
    unused_parameter_size: int  # what every rank's reducer found unused: nothing


def ddp_find_unused_parameters(ctx: Context) -> Iterator[Finding]:
    """DDP built with ``find_unused_parameters=True`` while its reducer found every parameter used."""
    stats = reducers(ctx)
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
        evidence=UnusedEvidence(ranks=len(stats), unused_parameter_size=0),
    )
    finding.provisional("low")  # until a job what-if times it on every rank
    if on_a_job(ctx):
        finding.request = JobRequest(RankChange(ddp={"find_unused_parameters": False}))
    else:
        finding.note = (
            "One process: the flag's cost is timed on a multi-process job (turbotrain doctor --nproc-per-node)."
        )
    yield finding


RULE = register(
    Rule("ddp-find-unused-parameters", detect=(Detect("runtime", ddp_find_unused_parameters),), edit=rank_change_edit)
)
