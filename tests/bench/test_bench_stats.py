"""A speed-up is called only when it exceeds the spread of the repeats."""

import pytest

from turbotrain.bench.stats import FASTER, NOISE, SLOWER, UNVERIFIED, compare, relative_spread


def test_clear_speedup_is_called():
    cmp = compare([200.0, 210.0, 205.0], [100.0, 101.0, 99.0])
    assert cmp.verdict == FASTER and cmp.called
    assert cmp.speedup == pytest.approx(205 / 100, rel=0.02)


def test_difference_inside_the_spread_is_not_called():
    # A median gain of 5% while the per-round ratios range over ~30%.
    cmp = compare([105.0, 90.0, 120.0], [100.0, 100.0, 100.0])
    assert cmp.speedup == pytest.approx(1.05)
    assert cmp.noise == pytest.approx(0.3 / 1.05)
    assert cmp.verdict == NOISE and not cmp.called


def test_slowdown_is_called_with_the_same_margin_on_a_log_scale():
    assert compare([50.0, 51.0, 49.0], [100.0, 100.0, 100.0]).verdict == SLOWER
    # A median of 0.8x while the per-round ratios range over 31%: not called.
    assert compare([80.0, 70.0, 95.0], [100.0, 100.0, 100.0]).verdict == NOISE


def test_rounds_are_paired_so_a_load_spike_on_both_plans_does_not_hide_a_gain():
    # Round 2 ran on a busy machine: both plans at half speed, the ratio steady at 1.5.
    cmp = compare([150.0, 75.0, 151.0], [100.0, 50.0, 100.0])
    assert cmp.verdict == FASTER
    assert relative_spread([100.0, 50.0, 100.0]) == pytest.approx(0.5)


def test_fewer_than_three_repeats_cannot_be_called():
    assert compare([300.0], [100.0]).verdict == UNVERIFIED
    assert compare([300.0, 310.0], [100.0, 100.0]).verdict == UNVERIFIED


def test_rounds_must_match():
    with pytest.raises(ValueError):
        compare([1.0, 2.0], [1.0])
