"""What "the losses match" means for each kind of fix's numerics (doctor/fixes/losses.py), on made-up losses."""

from __future__ import annotations

import pytest

from turbotrain.doctor.fixes.losses import loss_match, weakest

pytestmark = pytest.mark.reads_no_time  # made-up losses, no run

BEFORE = [2.5, 2.25, 2.0]


def test_exact_is_bitwise_and_precision_within_the_guards_tolerance():
    assert loss_match("exact", BEFORE, list(BEFORE))["match"] is True
    assert loss_match("exact", BEFORE, [2.5, 2.25, 2.0000001])["match"] is False
    assert loss_match("precision", BEFORE, [2.5, 2.26, 2.01])["match"] is True
    assert loss_match("precision", BEFORE, [2.5, 3.5, 4.0])["match"] is False


def test_other_random_draws_are_not_compared_and_say_which_draws():
    resampled = loss_match("resampled", BEFORE, [2.7, 2.1, 2.2])
    assert resampled["expected"] == "none" and resampled["match"] is None and "dropout masks" in resampled["note"]
    reinitialised = loss_match("reinitialised", BEFORE, [2.7, 2.1, 2.2])
    assert "when it is built" in reinitialised["note"]
    assert weakest(["exact", "resampled", "precision"]) == "resampled"
    assert weakest(["reinitialised", "precision"]) == "reinitialised"  # a model built from other draws
