"""`persistent-workers`: workers restart every epoch; their start-up is timed.

Reads: run.
Edit: `persistent_workers=True` in that `DataLoader(...)` call.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...edits import EditSpec
from ...findings import Evidence, Finding, Fix, speedup_for_rule
from ..common import loader_edit, ms
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class WorkerStartEvidence(Evidence):
    startup_ms: float  # the median start, workers to first batch
    epochs_started: int
    batches_per_epoch: int


def persistent_workers(ctx: Context) -> Iterator[Finding]:
    record = ctx.main_loader
    if record is None or record.settings["num_workers"] == 0 or record.settings["persistent_workers"]:
        return
    starts = [seconds for _, seconds in record.starts]
    if not starts:
        return
    startup = statistics.median(starts)
    per_epoch = record.settings.get("batches_per_epoch") or max(1, len(ctx.measured_steps))
    epoch_s = per_epoch * ctx.step_s
    share = startup / (epoch_s + startup) if epoch_s + startup > 0 else 0.0
    f = Finding(
        "persistent-workers",
        site=record.site,
        category="data_loading",
        speedup=speedup_for_rule("persistent-workers"),
        message=(
            f"Each epoch starts {record.settings['num_workers']} worker processes anew: "
            f"{ms(startup)} before its first batch, {share:.0%} of an epoch of {per_epoch} steps."
        ),
        fix=Fix(
            "DataLoader(..., persistent_workers=True)",
            plan={"persistent_workers": True},
            lightning="DataLoader(..., persistent_workers=True)",
            accelerate="DataLoader(..., persistent_workers=True)",
            hf_trainer="TrainingArguments(dataloader_persistent_workers=True)",
        ),
        evidence=WorkerStartEvidence(
            startup_ms=round(startup * 1e3, 2), epochs_started=len(starts), batches_per_epoch=per_epoch
        ),
    )
    f.set_gain(share, measured=True)
    yield f


def edit(ctx: Context, f: Finding) -> EditSpec:
    return loader_edit({"persistent_workers": True})


RULE = register(Rule("persistent-workers", detect=(Detect("runtime", persistent_workers),), edit=edit))
