"""`slow-storage`: reads through `tt.data` datasets (any URL scheme, DataLoader workers included) make up most of the
data wait: names the scheme and the measured MB/s, recommends the cache.

Reads: data layer + run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ....data import stats as data_stats
from ...findings import Evidence, Finding, Fix
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class StorageEvidence(Evidence):
    scheme: str  # the URL scheme read slowest ("file": local files)
    mb_per_s: float  # per read stream


def slow_storage(ctx: Context) -> Iterator[Finding]:
    """Data wait dominated by storage reads through ``turbotrain.data`` (the data layer decides)."""
    if ctx.storage_stats is None:
        return
    data_wait_s = ctx.seconds("data_loading") * len(ctx.measured_steps)
    total_s = ctx.step_s * len(ctx.measured_steps)
    found = data_stats.slow_storage_finding(ctx.storage_stats, data_wait_s, total_s)
    if not found:
        return
    record = ctx.main_loader
    f = Finding(
        "slow-storage",
        message=found["message"],
        fix=Fix(found["fix"]),
        category="data_loading",
        site=record.site if record else None,
        where=found.get("where"),
        evidence=StorageEvidence(scheme=found["scheme"], mb_per_s=found["mb_per_s"]),
    )
    est = found.get("est_speedup")
    f.set_gain(1.0 - 1.0 / est if est else None, measured=bool(found.get("measured")))
    f.severity = found.get("severity", f.severity)
    yield f


RULE = register(Rule("slow-storage", detect=(Detect("runtime", slow_storage),)))
