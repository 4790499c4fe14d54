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
