"""A Plan switch whose steps keep page-faulting memory in is re-timed in fresh processes: the doctor's own
process has run the script and other trials, and its allocator's history is not the training process's."""

from __future__ import annotations

import importlib

from doctor_helpers import run_doctor


def test_a_switch_whose_steps_page_fault_is_timed_in_fresh_processes(monkeypatch):
    plan_trials = importlib.import_module("turbotrain.doctor.whatif.plan_trials")  # the module, not its function
    fresh = importlib.import_module("turbotrain.doctor.whatif.fresh")
    monkeypatch.setattr(plan_trials, "FAULTS_PER_STEP", 0)  # every trial counts as churning
    started = []

    class Recorded(fresh.FreshTrial):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(fresh, "FreshTrial", Recorded)
    report = run_doctor("non_foreach_optimizer", what_if_budget_s=30.0)
    finding = next(f for f in report.findings if f.rule == "non-foreach-optimizer")
    what_if = finding.what_if
    assert what_if["timed_in"] == "fresh processes", (what_if, finding.note)
    assert len(what_if["rounds"]) == 3 and what_if["in_process_rounds"]  # the fresh rounds are the ones judged
    assert what_if["ratio"] == sorted(what_if["rounds"])[1]
    assert "fresh process" in finding.note

    retimed = [f for f in report.findings if (f.what_if or {}).get("timed_in") == "fresh processes"]
    baselines = {repr(f.trial.baseline) for f in retimed}
    assert len(started) == len(retimed) + len(baselines)  # one process per switch, the script's setting's shared
    assert all(child._proc.poll() is not None for child in started)  # none outlives the doctor
