"""Ranks late in turns: each rank draws its own sequence length every step (tests/doctor/scripts/
ddp_uneven_lengths.py), so no rank is the straggler, yet every step waits for whichever drew more."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from doctor_helpers import doctor_job, job_processes, rank_recording
from turbotrain.doctor.analysis.ranks import analyse_ranks

SCRIPT = Path(__file__).parent / "scripts" / "ddp_uneven_lengths.py"


def test_ranks_late_in_turns_are_named_with_the_phase_that_differs(tmp_path):
    proc, report = doctor_job(tmp_path, "--nproc-per-node", "2", str(SCRIPT))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert report["straggler"] is None, report["ranks"]
    u = report["imbalance"]
    assert u is not None and u["cause"] == "compute", report["ranks"]
    assert all(share < 0.75 for share in u["last_shares"].values())
    # Evened out, a step takes the mean of the two ranks' work: half the first one's wait on 2 ranks.
    assert u["cost"]["ms_per_step"] == pytest.approx(u["first_wait_ms"] / 2, rel=0.02)
    # The evidence: in (nearly) every step the last rank was the one given the 448-token batch.
    assert u["larger_input_share"] >= 0.75, u
    (finding,) = [f for f in report["findings"] if f["rule"] == "uneven-work"]
    assert "last in turns" in finding["message"] and "larger one" in finding["message"]
    assert not any(f["rule"] == "exposed-gradient-sync" for f in report["findings"])
    assert job_processes(str(SCRIPT)) == []


def _turns(waits_ms: list[list[float]]):
    """Two ranks whose waits at the all-reduce per step are ``waits_ms[rank]`` (the other rank's extra work)."""
    return analyse_ranks([rank_recording(r, data_ms=[1.0] * len(w), exposed_ms=w) for r, w in enumerate(waits_ms)])


def test_waits_in_turns_make_an_imbalance_and_a_steady_late_rank_a_straggler():
    steps = 12
    alternating = [[8.0 if i % 2 else 0.2 for i in range(steps)], [0.2 if i % 2 else 8.0 for i in range(steps)]]
    job = _turns(alternating)
    assert job is not None and job.straggler is None
    assert job.imbalance is not None
    shares = job.imbalance.last_shares
    assert sorted(shares) == [0, 1] and max(shares.values()) < 0.75 and sum(shares.values()) == pytest.approx(1.0)
    assert job.imbalance.first_wait_s == pytest.approx(7.8e-3)
    steady = [[8.0] * steps, [0.2] * steps]  # rank 1 waits least every step: it is the one the other waits for
    job = _turns(steady)
    assert job is not None and job.imbalance is None and job.straggler is not None and job.straggler.rank == 1


def test_small_waits_in_turns_are_not_an_imbalance():
    steps = 12
    job = _turns([[1.0 if i % 2 else 0.2 for i in range(steps)], [0.2 if i % 2 else 1.0 for i in range(steps)]])
    assert job is not None and job.imbalance is None  # 0.8 ms of a 40 ms step


def test_turns_with_batches_of_one_size_stay_low():
    """Ranks given batches of the same size every step, late in turns: noise explains it as well."""
    from turbotrain.doctor.analysis.context import build_context
    from turbotrain.doctor.rules import evaluate

    steps = 12
    waits = [[8.0 if i % 2 else 0.2 for i in range(steps)], [0.2 if i % 2 else 8.0 for i in range(steps)]]
    recordings = [rank_recording(r, data_ms=[1.0] * steps, exposed_ms=w) for r, w in enumerate(waits)]
    lead = dataclasses.replace(recordings[0], job=tuple(recordings))
    (finding,) = evaluate(build_context(lead), only=["uneven-work"])
    assert finding.severity == "low" and "larger one in only 0%" in finding.note


def test_turns_from_noise_leave_the_wait_every_rank_has_to_exposed_gradient_sync():
    """Both ranks wait 20 ms of a 40 ms step at the all-reduce, and one or the other 8 ms more in turns, with batches
    of one size: the turns are noise (uneven-work, low), the wait every rank has is still exposed-gradient-sync's
    (seen once on a balanced FSDP job, where turns by chance hid a 55% wait)."""
    from turbotrain.doctor.analysis.context import build_context
    from turbotrain.doctor.rules import evaluate

    steps = 12
    waits = [[28.0 if i % 2 else 20.2 for i in range(steps)], [20.2 if i % 2 else 28.0 for i in range(steps)]]
    recordings = [rank_recording(r, data_ms=[1.0] * steps, exposed_ms=w) for r, w in enumerate(waits)]
    lead = dataclasses.replace(recordings[0], job=tuple(recordings))
    ctx = build_context(lead)
    assert ctx.job is not None and ctx.job.imbalance is not None and not ctx.job.imbalance.evidenced
    found = {f.rule: f for f in evaluate(ctx, only=["uneven-work", "exposed-gradient-sync"])}
    assert found["uneven-work"].severity == "low"
    assert "no rank is late" in found["exposed-gradient-sync"].message, found["exposed-gradient-sync"].message


def test_a_late_rank_leaves_the_wait_every_rank_has_to_exposed_gradient_sync():
    """Rank 0 is late by 8 ms every step (a straggler), yet both ranks wait 20 ms of the 40 ms step besides: the
    straggler explains its 8 ms, not the wait every rank has (seen once on a 2-rank FSDP job: a 7% contention
    straggler beside a 57% wait took exposed-gradient-sync away). Where the late rank explains the wait, nothing."""
    from turbotrain.doctor.analysis.context import build_context
    from turbotrain.doctor.rules import evaluate

    def found(waits: list[list[float]]):
        recordings = [rank_recording(r, data_ms=[1.0] * len(w), exposed_ms=w) for r, w in enumerate(waits)]
        ctx = build_context(dataclasses.replace(recordings[0], job=tuple(recordings)))
        assert ctx.job is not None and ctx.job.straggler is not None and ctx.job.straggler.rank == 0
        return {f.rule: f for f in evaluate(ctx, only=["straggler", "exposed-gradient-sync"])}

    steps = 12
    shared = found([[20.2] * steps, [28.2] * steps])
    assert "50% of the step is the wait every rank has" in shared["exposed-gradient-sync"].message
    assert "exposed-gradient-sync" not in found([[0.2] * steps, [16.2] * steps])  # a 40% wait, all for rank 0
