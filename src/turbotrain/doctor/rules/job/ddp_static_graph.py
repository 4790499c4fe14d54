"""`ddp-static-graph`: DDP built with `find_unused_parameters=True` whose reducer found unused parameters, each rank
the same ones at every iteration (DDP's own check), and no `static_graph`: `static_graph=True,
find_unused_parameters=False` timed on every rank (DDP then finds the unused parameters in its first iteration,
stops walking the graph and all-reducing its map of used parameters every step, and rebuilds its buckets in gradient
order; should the graph change after all, it raises an error on the rank where it changed).

Reads: every rank's run.
Applies to: a multi-process job.
Edit: `static_graph=True, find_unused_parameters=False` in the `DistributedDataParallel(...)` call (timed on every
rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...findings import Evidence, Finding, Fix
from ...rank_change import RankChange
from ...requests import JobRequest
from ..common import MIB, call_site, on_a_job, rank_change_edit, reducers
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


# What ddp-static-graph times: the graph declared static, and DDP no longer told to look for unused parameters
# (static_graph finds them in its first iteration; with both set, DDP warns that the search is not needed).
_STATIC_GRAPH = {"static_graph": True, "find_unused_parameters": False}


@dataclass(frozen=True)
class StaticGraphEvidence(Evidence):
    ranks: int
    unused_parameter_mib: float
    keywords: dict[str, bool]  # the DDP keywords timed


def ddp_static_graph(ctx: Context) -> Iterator[Finding]:
    """DDP looks for unused parameters after every forward, and each rank finds the same ones at every iteration."""
    stats = reducers(ctx)
    if not stats or not all(
        s["find_unused_parameters"]
        and s.get("unused_parameter_size", 0.0) > 0
        and s.get("graph_static") == 1.0
        and not s.get("static_graph")
        for s in stats
    ):
        return
    unused_mib = max(s["unused_parameter_size"] for s in stats) / MIB
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
        evidence=StaticGraphEvidence(
            ranks=len(stats), unused_parameter_mib=round(unused_mib, 3), keywords=dict(_STATIC_GRAPH)
        ),
    )
    finding.provisional("low")  # until a job what-if times it on every rank
    if on_a_job(ctx):
        finding.request = JobRequest(RankChange(ddp=dict(_STATIC_GRAPH)))
    else:
        finding.note = "One process: static_graph is timed on a multi-process job (turbotrain doctor --nproc-per-node)."
    yield finding


RULE = register(Rule("ddp-static-graph", detect=(Detect("runtime", ddp_static_graph),), edit=rank_change_edit))
