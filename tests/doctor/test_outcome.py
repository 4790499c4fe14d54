"""What a what-if found reaches its finding in one step (whatif/outcome.py: attach): built by hand, milliseconds."""

from __future__ import annotations

from types import SimpleNamespace

from turbotrain.doctor.findings import Finding, Fix
from turbotrain.doctor.results import ThreadSetting, ThreadsResult
from turbotrain.doctor.whatif.outcome import Judged, Note, Outcome, Projected, attach
from turbotrain.measure import judge


def _finding() -> Finding:
    f = Finding("cpu-oversubscribed", "threads wait at a barrier", Fix("torch.set_num_threads(2)", lightning="L"),
                note="The rule's own note.")
    f.fix = Fix(f.fix.pytorch, lightning="L", framework="lightning")
    return f


def _threads(rounds: list[float]) -> tuple[ThreadsResult, object]:
    result = ThreadsResult(now=ThreadSetting(2, 0), tried=((1, 0),), candidate=ThreadSetting(1, 0),
                           rounds=tuple(rounds), baseline_ms=10.0, candidate_ms=10.0 / rounds[0])
    return result, judge(rounds)


def test_a_judged_gain_sets_the_share_and_the_fix_keeps_the_scripts_framework():
    f = _finding()
    result, verdict = _threads([2.0, 2.1])
    attach(f, None, Outcome(Judged(result, verdict, applies_to=0.5), fix=Fix("torch.set_num_threads(1)")))
    assert f.measured and f.what_if is not None and f.what_if.judgement is not None
    assert abs(f.gain_share - 0.5 * (1 - 1 / verdict.speedup)) < 1e-9 and f.severity == "high"
    assert f.fix.pytorch == "torch.set_num_threads(1)" and f.fix.framework == "lightning"


def test_no_gain_is_low_and_the_note_says_why_before_the_trials_own():
    f = _finding()
    result, verdict = _threads([0.98, 1.0])
    attach(f, None, Outcome(Judged(result, verdict, applies_to=1.0), before=(Note("Timed beside the loader."),)))
    assert f.severity == "low"
    assert f.note.startswith("Measured on this machine: no gain (x0.9") and f.note.endswith("Timed beside the loader.")


def test_notes_go_before_after_or_in_place_and_a_failed_fix_is_low():
    f = _finding()
    attach(f, None, Outcome(before=(Note("Not measured: no time.", at="before"),), low=True,
                            after=(Note("See the job.", at="after"),)))
    assert f.note == "Not measured: no time. The rule's own note. See the job." and f.severity == "low"
    assert not f.measured and f.what_if is None
    attach(f, None, Outcome(Projected(_threads([1.5])[0], 0.2), after=(Note("Timed once."),)))
    assert f.measured and f.gain_share == 0.2 and f.note == "Timed once."


def test_nothing_found_changes_nothing():
    f = _finding()
    before = (f.note, f.severity, f.fix, f.what_if)
    attach(f, SimpleNamespace(), None)
    assert (f.note, f.severity, f.fix, f.what_if) == before
