"""The numerics guard: close to the fp32 losses passes; drift or non-finite is rejected with a reason."""

from __future__ import annotations

import math

import pytest

from turbotrain.tuning.guard import check_losses

BASE = [2.30, 2.10, 1.90, 1.70, 1.50, 1.30]


def test_matching_and_slightly_rounded_losses_pass():
    assert check_losses(BASE, BASE).ok
    verdict = check_losses(BASE, [v * 1.008 for v in BASE])   # bf16-like rounding drift
    assert verdict.ok and 0.007 < verdict.max_deviation < 0.009


def test_drift_beyond_tolerance_is_rejected_naming_the_step():
    drifted = BASE[:4] + [1.80, 1.75]                           # stops learning at step 4
    verdict = check_losses(BASE, drifted, tolerance=0.05)
    assert not verdict.ok and verdict.worst_step == 5
    assert "step 5" in verdict.reason and "tolerance 5%" in verdict.reason


def test_non_finite_loss_is_rejected():
    verdict = check_losses(BASE, BASE[:3] + [math.nan, 1.0, 1.0])
    assert not verdict.ok and verdict.worst_step == 3 and "nan" in verdict.reason


def test_losses_training_towards_zero_are_compared_on_a_floor():
    base = [2.0, 1.0, 0.10, 0.010, 0.0010]
    assert check_losses(base, [2.0, 1.0, 0.10, 0.012, 0.0013]).ok    # noise in the last digits of tiny losses
    assert not check_losses(base, [2.0, 1.0, 0.10, 0.30, 0.30]).ok   # but not a loss that climbs back


def test_a_baseline_that_does_not_train_is_an_error():
    with pytest.raises(ValueError, match="does not train in fp32"):
        check_losses([2.0, math.inf], [2.0, 1.0])
