"""A plan's row in the ablation table: as planned, summarised from its repeats, compared with naive.

Every workload's runner builds its rows here (``bench/runner.py`` for the model workloads,
``bench/data_runner.py`` for the data workload's epochs), so a row means the same in every table.
"""

from __future__ import annotations

import math
import statistics

from ..measure import Trial
from ..plan import Plan
from .ablation import Candidate
from .results import Row
from .stats import compare, relative_spread
from .workload import Workload

__all__ = ["planned_row", "summarise", "compare_rows"]


def planned_row(cand: Candidate) -> Row:
    """The row as planned, before any measurement (all a skipped candidate gets)."""
    return Row(
        label=cand.label,
        kind=cand.kind,
        path=cand.path,
        speedup_name=cand.speedup,
        changes=cand.plan.changes(base=Plan(device=cand.plan.device)) if cand.plan else {},
        skip=cand.skip,
        note=cand.note,
        inverse=cand.inverse,
    )


def summarise(cand: Candidate, trials: list[Trial], wl: Workload, warmup_steps: int) -> Row:
    """The row of ``cand`` from its repeats: medians and spread, or the first failure's error."""
    row = planned_row(cand)
    if not trials:
        return row
    first = trials[0]
    row.applied, row.plan_skipped = first.applied, [(name, why) for name, why in first.skipped]
    failed = next((t for t in trials if not t.ok), None)
    if failed is not None:
        error = failed.error or "no steps were measured"
        if cand.script and error.startswith("ConfigError"):
            # The plan cannot run in one process (e.g. DDP); its entry names the script that measures it.
            row.skip = f"{error.split('. ')[0]}; measured by {cand.script}"
        else:
            row.error = error
        return row
    row.samples_per_step = first.samples_per_step
    row.units_per_s_runs = [t.samples_per_s * wl.units_per_sample for t in trials]
    row.units_per_s = statistics.median(row.units_per_s_runs)
    row.step_s = statistics.median(t.step_s for t in trials)
    row.spread = relative_spread(row.units_per_s_runs)
    overhead = [max(0.0, t.warmup_s - warmup_steps * t.step_s) for t in trials]
    row.warmup_cold_s = overhead[0]
    row.warmup_warm_s = statistics.median(overhead[1:]) if len(overhead) > 1 else None
    peaks = [t.peak_memory_bytes for t in trials if t.peak_memory_bytes is not None]
    row.peak_memory_bytes = max(peaks) if peaks else None
    row.first_loss, row.final_loss = first.losses[0], first.final_loss
    row.learning = math.isfinite(row.final_loss) and row.final_loss < row.first_loss
    return row


def compare_rows(rows: list[Row]) -> None:
    """Speed-up of each row against the naive row on the same path."""
    baselines = {r.path: r for r in rows if r.kind == "naive"}
    for row in rows:
        base = baselines.get(row.path)
        if base is None or not row.measured:
            continue
        row.baseline = base.label
        if row is base:
            row.speedup, row.noise, row.verdict = 1.0, row.spread, "baseline"
            continue
        if not base.measured:
            continue
        # An inverse row turns a tip off: what the tip buys is naive against the row.
        cand, ref = (base, row) if row.inverse else (row, base)
        cmp = compare(cand.units_per_s_runs, ref.units_per_s_runs)
        row.speedup, row.noise, row.verdict = cmp.speedup, cmp.noise, cmp.verdict
