"""The breakdown adds up: every second of a measured step lands in exactly one category."""

from __future__ import annotations

import statistics
from typing import get_args

import pytest

from turbotrain.doctor.analysis.breakdown import Overhead, _gpu_categories, compute_breakdown
from turbotrain.doctor.record.measurements import CATEGORIES, PHASE_CATEGORY, Phase, StepRecord
from turbotrain.doctor.report.model import exact_shares


def step(i, duration, phases, gap=0.0, preempted=None):
    return StepRecord(index=i, start=float(i), end=i + duration, phases=phases, gap_before_forward=gap,
                      forwards=1, backwards=1, optimizers=1, preempted=preempted)


def test_every_phase_the_clock_times_is_charged_to_a_category():
    # The types say each key is a Phase and each value a Category; only this says no Phase is left out.
    assert set(PHASE_CATEGORY) == set(get_args(Phase))
    assert set(PHASE_CATEGORY.values()) <= set(CATEGORIES)


def test_a_step_s_categories_sum_to_its_duration_and_split_the_untimed_time():
    s = step(0, 0.010, {"data": 0.002, "forward": 0.003, "backward": 0.002, "optimizer": 0.001}, gap=0.0015)
    cats = s.categories()
    assert sum(cats.values()) == pytest.approx(0.010)
    # 2 ms untimed: 1.5 ms before the forward (building the batch), the rest is step glue.
    assert cats["data_loading"] == pytest.approx(0.0035)
    assert cats["compute"] == pytest.approx(0.005 + 0.0005)
    assert cats["optimizer"] == pytest.approx(0.001)


def test_breakdown_adds_up_to_the_measured_mean_with_interference_apart():
    phases = {"data": 0.0002, "forward": 0.0004, "backward": 0.0003, "optimizer": 0.0001}
    steps = [step(i, 0.001, dict(phases), preempted=0.0) for i in range(8)]
    # One short step where another process held the CPU for 30 ms, in the middle of the backward.
    steps[5] = step(5, 0.031, {**phases, "backward": 0.0303}, preempted=0.030)
    b = compute_breakdown(steps, warmup=1, overhead=Overhead(method="counted", compute_share=0.25))
    assert b.steps == list(range(1, 8))
    assert sum(b.shares.values()) == pytest.approx(1.0)
    assert sum(b.seconds.values()) + b.interference_s == pytest.approx(statistics.fmean(b.step_seconds))
    assert b.interference_s == pytest.approx(0.030 / 7)
    # The stall came out of compute, where it was: the step looks like its neighbours again.
    assert b.timeline[4]["compute"] == pytest.approx(b.timeline[0]["compute"])
    assert b.shares["data_loading"] == pytest.approx(0.2)
    # The forward+backward's per-op overhead (a quarter of it here) is python_overhead.
    assert b.shares["python_overhead"] == pytest.approx(0.25 * 0.7) and b.shares["compute"] == pytest.approx(0.75 * 0.7)
    assert b.dispatch_share == pytest.approx(0.25 * 0.7)
    assert b.bottleneck == "compute"


def test_a_step_of_tiny_ops_is_python_overhead_bound():
    """Counted per-op cost over most of the forward+backward: the bottleneck says python_overhead."""
    steps = [step(i, 0.001, {"data": 0.0001, "forward": 0.0005, "backward": 0.0003, "optimizer": 0.0001})
             for i in range(6)]
    b = compute_breakdown(steps, warmup=1, overhead=Overhead(method="counted", compute_share=0.9))
    assert b.bottleneck == "python_overhead" and b.shares["python_overhead"] == pytest.approx(0.9 * 0.8)


def test_an_optimizer_loop_of_tiny_kernels_is_optimizer_bound():
    """801 small tensors: the optimizer's time is nearly all per-op overhead, and it is still the optimizer."""
    steps = [step(i, 0.064, {"forward": 0.012, "backward": 0.010, "optimizer": 0.042}) for i in range(6)]
    b = compute_breakdown(steps, warmup=1, overhead=Overhead(method="counted", compute_share=0.5,
                                                             optimizer_s=0.038))
    assert b.bottleneck == "optimizer" and b.shares["optimizer"] == pytest.approx(42 / 64)
    assert b.dispatch_of("optimizer") == pytest.approx(38 / 42)


def test_a_long_step_loses_its_wait_in_proportion():
    """Contention spread over a long step (validation here) scales every part of it down alike."""
    steps = [step(i, 0.010, {"forward": 0.006, "optimizer": 0.004}, preempted=0.0) for i in range(6)]
    steps[3] = step(3, 0.080, {"forward": 0.012, "optimizer": 0.008, "eval": 0.060}, preempted=0.040)
    b = compute_breakdown(steps, warmup=0)
    row = b.timeline[3]
    assert row["interference"] == pytest.approx(40.0)
    assert row["outside_step"] == pytest.approx(30.0) and row["compute"] == pytest.approx(6.0)


def test_without_schedstat_a_lone_spike_is_taken_as_interference():
    steps = [step(i, 0.010, {"forward": 0.006, "optimizer": 0.004}) for i in range(8)]
    steps[3] = step(3, 0.050, {"forward": 0.046, "optimizer": 0.004})
    b = compute_breakdown(steps, warmup=0)
    assert b.interference_s == pytest.approx(0.040 / 8)


def test_periodic_validation_stays_in_the_numbers():
    steps = [step(i, 0.010, {"forward": 0.006, "optimizer": 0.004}, preempted=0.0) for i in range(10)]
    for i in (3, 7):
        steps[i] = step(i, 0.060, {"forward": 0.006, "optimizer": 0.004, "eval": 0.050}, preempted=0.0)
    b = compute_breakdown(steps, warmup=1)
    assert b.interference_s == 0
    # Every 4 steps, 50 ms each time: spread over its period, whatever the window holds.
    assert [p.every for p in b.periodic] == [4] and b.periodic[0].cost_s == pytest.approx(0.050)
    assert b.seconds["outside_step"] == pytest.approx(0.050 / 4)


def test_validation_every_other_step_is_periodic_work_in_every_window():
    """Work in half the steps: a median would land between the two kinds of step and see no spike at all in an
    even window; the ordinary step is the lower quartile's."""
    for n in (12, 13, 14):
        steps = [step(i, 0.010, {"forward": 0.006, "optimizer": 0.004}, preempted=0.0) for i in range(n)]
        for i in range(2, n, 2):
            steps[i] = step(i, 0.060, {"forward": 0.006, "optimizer": 0.004, "eval": 0.050}, preempted=0.0)
        b = compute_breakdown(steps, warmup=1)
        [periodic] = b.periodic
        assert periodic.every == 2 and periodic.steps == list(range(2, n, 2)), (n, periodic)
        assert periodic.cost_s == pytest.approx(0.050)
        assert b.seconds["outside_step"] == pytest.approx(0.050 / 2)


def test_the_work_around_a_validation_is_part_of_its_cost():
    # The steps that validate also spend 3 ms more before their next forward (model.train(), the loop resuming)
    # and 1 ms more in the forward (caches the validation batches evicted): running the validation less often
    # saves that too, so it is the validation's cost, not data loading's or compute's.
    steps = [step(i, 0.010, {"forward": 0.006, "optimizer": 0.004}, preempted=0.0) for i in range(10)]
    for i in (3, 7):
        steps[i] = step(i, 0.064, {"forward": 0.007, "optimizer": 0.004, "eval": 0.050}, gap=0.003, preempted=0.0)
    b = compute_breakdown(steps, warmup=1)
    assert b.periodic[0].cost_s == pytest.approx(0.054)
    assert set(b.periodic[0].around) == {"data_loading", "compute"}
    assert b.seconds["outside_step"] == pytest.approx(0.054 / 4)
    assert b.seconds["data_loading"] == pytest.approx(0.0) and b.seconds["compute"] == pytest.approx(0.006)
    assert sum(b.seconds.values()) == pytest.approx(0.010 + 0.054 / 4)


def test_on_cuda_compute_is_device_time_and_idle_time_goes_to_the_host():
    cats = dict.fromkeys(CATEGORIES, 0.0)
    cats.update(data_loading=0.004, compute=0.003, optimizer=0.001, host_sync=0.002)
    out = _gpu_categories(cats, 0.010, {"forward": 0.002, "backward": 0.003, "optimizer": 0.001})
    assert sum(out.values()) == pytest.approx(0.010)
    assert out["compute"] == pytest.approx(0.005) and out["optimizer"] == pytest.approx(0.001)
    # 4 ms of device idle time split by what the host did: 4 data, 2 sync, 4 issuing ops.
    assert out["data_loading"] == pytest.approx(0.0016)
    assert out["host_sync"] == pytest.approx(0.0008)
    assert out["python_overhead"] == pytest.approx(0.0016)


def test_rounded_shares_still_sum_to_one():
    shares = {k: 1 / 7 for k in CATEGORIES}
    assert sum(exact_shares(shares).values()) == pytest.approx(1.0, abs=1e-12)


def test_slow_steps_right_after_the_warm_up_are_left_out_so_the_bar_matches_the_headline():
    """Two steps still settling after the warm-up (79 ms, 14 ms against 2.4 ms) would make the mean, and the
    bar, three times the median: they are left out, and said."""
    phases = {"data": 0.0004, "forward": 0.0012, "backward": 0.0006, "optimizer": 0.0002}
    steps = [step(i, 0.0024, dict(phases)) for i in range(12)]
    steps[1] = step(1, 0.079, {**phases, "forward": 0.0778})
    steps[2] = step(2, 0.014, {**phases, "data": 0.0120})
    b = compute_breakdown(steps, warmup=1)
    assert b.steps == list(range(3, 12)) and b.settling == pytest.approx([0.079, 0.014])
    assert sum(b.seconds.values()) + b.interference_s == pytest.approx(b.median_s)


def test_a_slow_step_later_in_the_window_is_not_settling():
    phases = {"forward": 0.0012, "optimizer": 0.0002}
    steps = [step(i, 0.0014, dict(phases)) for i in range(12)]
    steps[5] = step(5, 0.030, {**phases, "forward": 0.0298})
    b = compute_breakdown(steps, warmup=1)
    assert b.settling == [] and 5 in b.steps
