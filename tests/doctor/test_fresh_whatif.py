"""A Plan switch whose steps keep page-faulting memory in is re-timed in fresh processes: the doctor's own
process has run the script and other trials, and its allocator's history is not the training process's."""

from __future__ import annotations

import importlib

import pytest

from doctor_helpers import run_doctor
from turbotrain.measure import judge


def test_a_switch_whose_steps_page_fault_is_timed_in_fresh_processes(monkeypatch):
    switches = importlib.import_module("turbotrain.doctor.whatif.switches")
    fresh = importlib.import_module("turbotrain.doctor.whatif.fresh")
    monkeypatch.setattr(switches, "FAULTS_PER_STEP", 0)  # every trial counts as churning
    started = []

    class Recorded(fresh.FreshTrial):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)
            self.clears_before_backward = kwargs["clear_grads_before_backward"]

    monkeypatch.setattr(fresh, "FreshTrial", Recorded)
    report = run_doctor("non_foreach_optimizer", what_if_budget_s=30.0)
    finding = next(f for f in report.findings if f.rule == "non-foreach-optimizer")
    what_if = finding.what_if
    assert what_if.timed_in == "fresh processes", (what_if, finding.note)
    assert len(what_if.rounds) == 3 and what_if.in_process_rounds  # the fresh rounds are the ones judged
    assert what_if.ratio == sorted(what_if.rounds)[1]
    assert "fresh process" in finding.note

    retimed = [f for f in report.findings if getattr(f.what_if, "timed_in", None) == "fresh processes"]
    baselines = {repr(f.request.baseline) for f in retimed}
    assert len(started) == len(retimed) + len(baselines)  # one process per switch, the script's setting's shared
    assert all(child._proc.poll() is not None for child in started)  # none outlives the doctor
    # The script clears its gradients between its forward and its backward; so do the trials.
    assert all(child.clears_before_backward for child in started)


@pytest.mark.parametrize("name, before_backward", [("non_foreach_optimizer", True), ("batch_size_one", False)])
def test_the_fresh_trials_clear_gradients_where_the_script_does(name, before_backward):
    """``loss = ...; opt.zero_grad(); loss.backward()`` frees the old gradients after the forward has allocated
    its activations; ``opt.zero_grad()`` before the forward (or after the step) frees them before: the allocator
    then serves different blocks, and a trial in a fresh process follows the script."""
    from doctor_helpers import script
    from turbotrain.doctor.analysis.context import build_context
    from turbotrain.doctor.record.recorder import Recorder
    from turbotrain.doctor.record.runner import run_script

    recorder = Recorder(measure=3, warmup=1, profile=0)
    run_script(script(name), [], recorder)
    ctx = build_context(recorder.recording(), recorder.live_objects(), script(name))
    assert ctx.zero_grad_before_backward is before_backward


def test_a_churning_switch_timed_only_in_the_doctors_process_is_rated_low(monkeypatch):
    """Where the fresh processes cannot run (the budget is spent), the warm process's figure stands but reads high
    for a switch whose steps page-fault (siamese_network's bf16: x1.23 there, x1.01 in the script itself): it is
    kept, and rated low."""
    switches = importlib.import_module("turbotrain.doctor.whatif.switches")
    fresh = importlib.import_module("turbotrain.doctor.whatif.fresh")
    monkeypatch.setattr(switches, "FAULTS_PER_STEP", 0)
    monkeypatch.setattr(fresh.FreshProcesses, "rounds", lambda self, base, plan, rounds=3: "the budget is spent")
    report = run_doctor("non_foreach_optimizer", what_if_budget_s=30.0)
    warm = [f for f in report.findings if getattr(f.what_if, "timed_in", None) == "this process"]
    assert warm and all(f.severity == "low" and f.what_if.rounds for f in warm), [f.to_dict() for f in warm]
    assert all("so it is rated low" in f.note for f in warm)


class _SteppingChild:
    """A fresh process's stand-in: each turn's step count is recorded, and a turn's steps take ``step_s`` each,
    except where ``slow`` says the machine is in a slow spell at that turn (it is twice as slow then)."""

    def __init__(self, log: list, name: str, step_s: float, slow: set[int]):
        self.log, self.name, self.step_s, self.slow = log, name, step_s, slow

    def ready(self) -> dict:
        return {"applied": [], "skipped": []}

    def steps(self, n: int) -> list[float]:
        turn = len(self.log)
        self.log.append((self.name, n))
        return [self.step_s * (2 if turn in self.slow else 1)] * n

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    "step_s, steps, per_turn, turns, read", [(1.5, 3, 1, 9, 1.0), (0.2, 4, 3, 4, 1.0), (0.01, 10, 10, 3, 2.0)]
)
def test_long_steps_take_shorter_turns_each_round_spanning_them_all(step_s, steps, per_turn, turns, read):
    """At 1.5 s a step a turn of three steps lasts 4.5 s, as long as a slow spell of the machine: one spell on
    the baseline's turn set a whole round's ratio (llm.c's fused AdamW read x1.57 in fresh processes, rounds 1.57,
    1.20, 1.59, against x1.18 in the script itself). Shorter turns, each round pooling turns from the whole
    comparison: a spell weighs on every round alike. Short steps keep three turns of ``steps``."""
    from types import SimpleNamespace

    from turbotrain.doctor.whatif.common import Budget
    from turbotrain.doctor.whatif.fresh import FreshProcesses
    from turbotrain.plan import Plan

    log: list = []
    slow_turns = {0, 2}  # two of the first rounds' baseline turns fall in a slow spell
    trials = SimpleNamespace(model_s=step_s, steps=steps, warmup=2)
    processes = FreshProcesses(SimpleNamespace(), trials, Budget(1e6))
    starts = iter(["baseline", "candidate"])
    processes._start = lambda plan, keep: _SteppingChild(log, next(starts), step_s, slow_turns)
    ratios = processes.rounds(Plan(), Plan(fused_optimizer=True))
    assert log == [(side, per_turn) for _ in range(turns) for side in ("baseline", "candidate")]
    assert len(ratios) == 3
    # the same steps each way as three rounds of ``steps``
    assert sum(n for side, n in log if side == "baseline") >= 3 * steps - per_turn
    # Two slow turns of the baseline, as a switch that buys nothing: outweighed where they are pooled with others.
    assert judge(ratios).speedup == pytest.approx(read)
