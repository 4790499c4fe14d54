"""A single timed comparison is judged on its own ratio against the window's noise, not on the step-level
figure derived from it (a 1.6x faster attention that is a sixth of the step is not noise)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from turbotrain.doctor.findings import Finding, Fix
from turbotrain.doctor.results import AttentionResult, Judgement
from turbotrain.doctor.whatif.outcome import cap_to_noise


def _finding(pair_ratio: float, share: float, rounds: int = 2) -> Finding:
    f = Finding(rule="manual-attention", message="m", fix=Fix(pytorch="sdpa"))
    f.set_gain(share, measured=True)
    f.what_if = AttentionResult(q_shape=(2, 64, 32), keys=64, causal=False, manual_ms=1.0, sdpa_ms=1.0,
                                calls_per_step=1.0, pair_ratio=pair_ratio, pair_rounds=rounds)
    return f


def test_a_clear_component_gain_stands_on_a_noisy_window():
    f = _finding(pair_ratio=1.65, share=0.155)   # x1.18 on the step, under a 0.185 noise floor
    cap_to_noise(f, SimpleNamespace(noise_floor=0.37))
    assert f.severity == "medium" and f.note is None


def test_a_component_gain_inside_the_noise_rates_low():
    f = _finding(pair_ratio=1.12, share=0.155)
    cap_to_noise(f, SimpleNamespace(noise_floor=0.37))
    assert f.severity == "low" and "x1.12" in f.note


def test_a_single_timing_per_side_gets_the_whole_floor():
    """Loader rates are one timing per setting: the same ratio that two rounds would carry is noise here."""
    two, one = _finding(1.25, 0.2, rounds=2), _finding(1.25, 0.2, rounds=1)
    for f in (two, one):
        cap_to_noise(f, SimpleNamespace(noise_floor=0.3))
    assert two.severity != "low" and one.severity == "low"


def test_a_finding_judged_from_rounds_keeps_its_verdict():
    f = _finding(pair_ratio=1.01, share=0.3)
    f.what_if = dataclasses.replace(f.what_if, judgement=Judgement(ratio=1.3, noise=0.1, verdict="faster"))
    cap_to_noise(f, SimpleNamespace(noise_floor=0.5))
    assert f.severity == "high"


def _rounds(first, more, confirm_gain):
    from turbotrain.doctor.whatif.common import interleaved_rounds

    queue = list(more)
    budget = SimpleNamespace(allows=lambda cost: True)
    return interleaved_rounds(None, budget, 1.0, first, lambda: queue.pop(0), confirm_gain=confirm_gain)


def test_a_gain_that_changes_numerics_is_timed_a_third_time_before_it_is_believed():
    # Two rounds that both read x1.15 (a load burst can give both): three for a switch that changes numerics.
    assert _rounds((1.15, 1.0), [(1.15, 1.0), (1.0, 1.0)], confirm_gain=True) == [1.15, 1.15, 1.0]
    assert _rounds((1.15, 1.0), [(1.15, 1.0), (1.0, 1.0)], confirm_gain=False) == [1.15, 1.15]
    assert _rounds((1.02, 1.0), [(1.01, 1.0), (1.2, 1.0)], confirm_gain=True) == [1.02, 1.01]  # no gain to confirm
