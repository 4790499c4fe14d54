"""A what-if the budget could not hold says so on its finding, with the budget that gives it room; one that ran
and declined for its own reasons, or gave an outcome, is left to say that itself."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from turbotrain.doctor import whatif
from turbotrain.doctor.findings import Finding, Fix
from turbotrain.doctor.requests import OwnTrial
from turbotrain.doctor.whatif.outcome import Note, Outcome

pytestmark = pytest.mark.reads_no_time  # the budget is run out on purpose; no assertion reads a measured time


def _finding(line_note: str) -> Finding:
    return Finding("compile-graph-break", "a break", Fix("by hand"), note=line_note, request=OwnTrial())


def test_a_trial_the_budget_refused_or_never_reached_says_so_and_the_others_do_not(monkeypatch):
    refused, declined, answered, spent, never = (_finding(name) for name in
                                                  ("refused.", "declined.", "answered.", "spent.", "never."))

    def trial(ctx, finding, budget):
        if finding is refused:
            assert not budget.allows(50.0)  # more than the whole budget
            return None
        if finding is answered:
            return Outcome(before=(Note("said by the trial."),))
        if finding is spent:
            time.sleep(budget.left + 0.05)  # runs the budget out: the next trial is never started
        return None

    monkeypatch.setattr(whatif, "_own_trial", trial)
    findings = [refused, declined, answered, spent, never]
    whatif._run_what_ifs(SimpleNamespace(), findings, budget_s=1.0, allow_compile=False)
    assert refused.note.startswith("refused. Not timed: its trial needed about 50 s and ")
    assert refused.note.endswith("of the what-if budget were left; `--what-if-budget 60` gives it room.")
    assert never.note == ("never. Not timed: the what-if budget (1 s) was spent before its trial's turn; "
                          "`--what-if-budget 11` gives it room.")
    assert declined.note == "declined." and spent.note == "spent."  # ran, and said nothing of the budget
    assert "Not timed" not in answered.note and "said by the trial." in answered.note
