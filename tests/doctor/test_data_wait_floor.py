"""`num-workers` on a loader in the training process: batches of well under a millisecond stay low, and one slow
batch in the window (a stall of the machine) is no rate that lifts them over the bar. Synthetic steps, milliseconds.

A CI run read a clean script's 0.4-ms batches as medium: one of its four measured steps waited 4 ms on data.
"""

from __future__ import annotations

import dataclasses

from doctor_helpers import rank_recording
from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context
from turbotrain.doctor.record.measurements import EventCounts, LoaderRecord, StepRecord
from turbotrain.doctor.rules import evaluate
from turbotrain.doctor.sites import Site
from turbotrain.hardware import detect

LOADER = Site("train.py", 20, "batches")


def _context(data_ms: dict[int, float], steps: int = 23, warmup: int = 3) -> Context:
    records, t = [], 0.0
    for i in range(steps):
        data = data_ms.get(i, 0.4) / 1e3
        records.append(StepRecord(i, t, t + data + 0.0024, {"data": data, "forward": 0.0012, "backward": 0.0012},
                                  forwards=1, backwards=1, optimizers=1))
        t += data + 0.0024
    breakdown = compute_breakdown(records, warmup)
    nexts = EventCounts("next", LOADER, tuple((s.index, 1, s.phases["data"], 0) for s in records))
    loader = LoaderRecord(key=1, site=LOADER, settings={"num_workers": 0}, nexts=nexts)
    return Context(script="train.py", base=".", hw=detect("cpu"), device="cpu", breakdown=breakdown,
                   measured_steps=breakdown.steps, step_records=records, loaders=[loader])


def _severity(ctx: Context) -> str | None:
    found = [f.severity for f in evaluate(ctx, only=["num-workers"])]
    return found[0] if found else None


def test_batches_of_well_under_a_millisecond_stay_low_even_with_one_slow_batch():
    assert _severity(_context({})) == "low"  # 0.4 of 2.8 ms: 14% of the step, but workers would not win it back
    four = _context({2: 4.4}, steps=6, warmup=1)  # four measured steps, one of them stalled: a mean of 1.4 ms
    assert four.seconds("data_loading") > 1e-3
    assert _severity(four) == "low"


def test_slow_batches_that_recur_or_every_batch_over_a_millisecond_are_medium():
    assert _severity(_context({i: 1.6 for i in range(23)})) in ("medium", "high")
    assert _severity(_context({5: 12.0, 12: 12.0, 19: 12.0})) in ("medium", "high")  # a slow batch in 7: a rate


def test_on_a_job_the_workers_proposed_fit_each_ranks_share_of_the_host():
    ctx = _context({i: 1.6 for i in range(23)})
    (alone,) = evaluate(ctx, only=["num-workers"])
    cores = ctx.hw.cpu_cores
    assert alone.fix.plan["num_workers"] == max(2, min(4, cores))
    ranks = [dataclasses.replace(rank_recording(r, [1.0] * 3, [1.0] * 3), host="node0") for r in (0, 1)]
    on_a_job = dataclasses.replace(ctx, recording=dataclasses.replace(ranks[0], job=tuple(ranks)))
    (shared,) = evaluate(on_a_job, only=["num-workers"])
    # Two ranks on this host: each one's workers come out of half its cores.
    assert shared.fix.plan["num_workers"] == min(max(2, min(4, cores)), max(1, cores // 2))
    assert f"num_workers={shared.fix.plan['num_workers']}," in shared.fix.pytorch

