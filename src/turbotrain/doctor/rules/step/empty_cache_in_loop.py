"""`empty-cache-in-loop`: `torch.cuda.empty_cache()` per step.

Reads: run, source.
Applies to: a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...findings import Evidence, Finding, Fix
from ..common import sources, static_finding
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class EmptyCacheEvidence(Evidence):
    per_step: float


def empty_cache(ctx: Context) -> Iterator[Finding]:
    for stat in ctx.ran_sites("empty_cache"):
        f = Finding(
            "empty-cache-in-loop",
            site=stat.site,
            category="compute",
            message=(
                f"torch.cuda.empty_cache() runs {stat.per_step:g}x per step: it hands the caching allocator's "
                "free blocks back to the driver, so the next step allocates them again with slow, "
                "synchronizing cudaMalloc calls."
            ),
            fix=Fix(
                "Remove it from the loop (call it at most once, e.g. before evaluation of a different model); "
                "use torch.cuda.memory_summary() to find what really holds memory."
            ),
            evidence=EmptyCacheEvidence(per_step=stat.per_step),
        )
        f.provisional("medium")
        yield f.on_cpu(ctx)


def empty_cache_static(ctx: Context) -> Iterator[Finding]:
    for index in sources(ctx):
        for call, _ in index.calls("cuda.empty_cache"):
            if index.runs_per_step(call):
                yield static_finding(
                    "empty-cache-in-loop",
                    index,
                    call,
                    "torch.cuda.empty_cache() runs inside the training loop: each call returns cached "
                    "blocks to the driver, so the next allocations are slow cudaMalloc calls again.",
                    Fix("remove it from the loop"),
                )


RULE = register(
    Rule(
        "empty-cache-in-loop",
        detect=(
            Detect("runtime", empty_cache),
            Detect("static", empty_cache_static),
        ),
    )
)
