"""The sampler of untimed batch building looks often enough to name a line in a short run."""

from turbotrain.doctor.record.gap_sampler import MAX_INTERVAL_S, MIN_INTERVAL_S, TARGET_SAMPLES, sampling_interval


def test_short_gaps_in_a_short_run_are_looked_at_more_often():
    # Six steps with 8 ms of batch building: at the default 10 ms only about five looks fall in a gap.
    interval = sampling_interval(8e-3, 6)
    assert interval < MAX_INTERVAL_S
    assert 6 * 8e-3 / interval >= TARGET_SAMPLES - 1e-9


def test_long_gaps_keep_the_default_and_tiny_ones_the_floor():
    assert sampling_interval(0.2, 20) == MAX_INTERVAL_S
    assert sampling_interval(1e-4, 3) == MIN_INTERVAL_S
    assert sampling_interval(8e-3, None) == MAX_INTERVAL_S  # no window end: the sampler runs to the script's end


def test_the_interval_follows_the_measured_gaps_not_the_warm_up_step_that_started_it():
    """The sampler starts on the last warm-up step's record (103 ms of gap in a GAN script whose measured gaps
    are 8.8 ms): sized from it, it looked once per 10 ms and named the line from four or five looks."""
    from collections import Counter
    from types import SimpleNamespace

    from turbotrain.doctor.record.gap_sampler import GapSampler

    record = SimpleNamespace
    tracker = SimpleNamespace(steps=[record(gap_before_forward=5e-3), record(gap_before_forward=0.103)])
    sampler = GapSampler(tracker, Counter(), warmup=2, interval_s=sampling_interval(0.103, 6), measured_steps=6)
    assert sampler.interval_s == MAX_INTERVAL_S
    sampler.resize()  # no measured step yet: unchanged
    assert sampler.interval_s == MAX_INTERVAL_S
    tracker.steps += [record(gap_before_forward=8.8e-3), record(gap_before_forward=8.7e-3)]
    sampler.resize()
    assert sampler.interval_s == sampling_interval(8.75e-3, 6) < MAX_INTERVAL_S / 3
