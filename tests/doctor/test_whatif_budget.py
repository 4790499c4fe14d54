"""A what-if the budget could not hold says so on its finding, with the budget that gives it room; one that ran
and declined for its own reasons, or gave an outcome, is left to say that itself."""

from __future__ import annotations

import re
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


def test_a_trial_step_of_a_step_that_accumulates_is_budgeted_as_one_micro_batch(monkeypatch):
    """A trial steps one captured micro-batch at a time: where the script accumulates 4 before its optimizer step,
    a trial step costs a quarter of the step's compute, not all of it (the budget would refuse trials that fit,
    and they would run the fewest steps)."""
    import torch

    from turbotrain.doctor.whatif import common
    from turbotrain.doctor.whatif.common import ModelTrials
    from turbotrain.plan import Plan

    monkeypatch.setattr(common, "optimizer_recipe", lambda ctx: (torch.optim.SGD, {"lr": 0.1}))
    monkeypatch.setattr(common, "baseline_plan", lambda ctx: Plan())
    seconds = {"compute": 0.4, "python_overhead": 0.04, "optimizer": 0.01}

    def ctx(backwards: float) -> SimpleNamespace:
        capture = SimpleNamespace(module=torch.nn.Linear(2, 2), args=(), kwargs={})
        return SimpleNamespace(capture=capture, seconds=seconds.get, backwards_per_step=lambda: backwards)

    whole, accumulated = ModelTrials(ctx(1.0), None), ModelTrials(ctx(4.0), None)
    assert whole.model_s == pytest.approx(0.45)
    assert accumulated.model_s == pytest.approx(0.44 / 4 + 0.01)
    assert accumulated.cost < whole.cost / 2
    assert ModelTrials(ctx(0.0), None).model_s == pytest.approx(0.45)  # no backward seen: the whole step


def test_a_quick_rule_trial_runs_before_the_plan_s_and_the_others_after(monkeypatch):
    """hand-written-layer's trial is a few of the model's steps: at the default budget the plan's fresh processes
    left it 'Not timed' on the calibration pair; it runs before them where a quarter of the budget holds it."""
    from turbotrain.doctor.requests import PlanRequest

    order: list[tuple[str, float]] = []
    monkeypatch.setattr(whatif, "_own_trial", lambda ctx, f, budget: order.append((f.rule, budget.seconds)))
    monkeypatch.setattr(whatif, "plan_trials", lambda ctx, fs, budget, allow: order.append(("plan", 0.0)) or [])
    findings = [Finding("activation-memory", "m", Fix(""), request=OwnTrial()),
                Finding("no-mixed-precision", "p", Fix(""), request=PlanRequest({"precision": "bf16-mixed"})),
                Finding("hand-written-layer", "h", Fix(""), request=OwnTrial())]
    whatif._run_what_ifs(SimpleNamespace(), findings, budget_s=8.0, allow_compile=False)
    # Early with a quarter of the budget at most; not timed there (a long step), it is tried again at its turn, so
    # the plan's trials are not starved by it.
    assert [rule for rule, _ in order] == ["hand-written-layer", "plan", "activation-memory", "hand-written-layer"]
    assert order[0][1] <= 2.0 and order[3][1] == 8.0


def test_a_rule_trial_the_run_shows_large_runs_first_with_the_whole_budget(monkeypatch):
    """llm.c --compile 1 for 10 iterations: compiling dwarfs the training, but compile-pays-back's trial came after
    the plan's (the fused optimizer on the eager original) and was left 'Not timed' one second short."""
    from turbotrain.doctor.requests import LoaderRequest, PlanRequest

    order: list[tuple[str, float]] = []
    monkeypatch.setattr(whatif, "_own_trial", lambda ctx, f, budget: order.append((f.rule, budget.left)))
    monkeypatch.setattr(whatif, "plan_trials", lambda ctx, fs, budget, allow: order.append(("plan", 0.0)) or [])
    monkeypatch.setattr(whatif, "loader_trial", lambda ctx, f, budget: order.append(("loader", 0.0)))
    findings = [Finding("num-workers", "w", Fix(""), request=LoaderRequest()),
                Finding("non-foreach-optimizer", "o", Fix(""), request=PlanRequest({"fused_optimizer": True})),
                Finding("compile-regional", "r", Fix(""), request=OwnTrial()),
                Finding("compile-pays-back", "c", Fix(""), request=OwnTrial(first=True))]
    whatif._run_what_ifs(SimpleNamespace(), findings, budget_s=30.0, allow_compile=False)
    assert [rule for rule, _ in order][:3] == ["compile-pays-back", "loader", "plan"]
    assert order[0][1] > 29.0  # the whole budget, not the early slot's quarter


def test_a_compiled_models_optimizer_and_precision_switches_are_timed_on_its_eager_original(monkeypatch):
    """llm.c's train_gpt2.py --compile 1: its non-foreach AdamW took 24% of the step and went untimed, without a
    word, because the model was compiled. The optimizer steps outside the graph; precision's gain is the matmuls',
    which the eager original runs too (said to be an eager figure); a switch that otherwise changes the graph (a
    conv's bias dropped) says why it is not timed."""
    import torch

    from turbotrain.doctor.requests import PlanRequest
    from turbotrain.doctor.whatif import common, switches
    from turbotrain.plan import Plan

    monkeypatch.setattr(common, "optimizer_recipe", lambda ctx: (torch.optim.AdamW, {"lr": 1e-3, "foreach": False}))
    monkeypatch.setattr(common, "baseline_plan", lambda ctx: Plan(device="cpu"))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    compiled = torch.compile(model, backend="eager")
    capture = SimpleNamespace(module=compiled, args=(torch.randn(4, 8),), kwargs={})
    seconds = {"compute": 0.002, "python_overhead": 0.0, "optimizer": 0.001}
    ctx = SimpleNamespace(capture=capture, facts=SimpleNamespace(compiled=True), seconds=seconds.get,
                          backwards_per_step=lambda: 1.0, noise_floor=0.0, device="cpu")
    fused = Finding("non-foreach-optimizer", "loop", Fix("fused"), request=PlanRequest({"fused_optimizer": True}))
    bf16 = Finding("no-mixed-precision", "fp32", Fix("autocast"), request=PlanRequest({"precision": "bf16-mixed"}))
    bias = Finding("conv-bias-before-bn", "bias", Fix("bias=False"), request=PlanRequest({"drop_conv_bias": True}))
    trained = []
    real_trial = common.run_trial
    monkeypatch.setattr(common, "run_trial", lambda m, *a, **k: trained.append(m) or real_trial(m, *a, **k))
    found = switches.plan_trials(ctx, [fused, bf16, bias], whatif.Budget(60.0), False)
    outcomes = dict((f.rule, o) for f, o in found)
    assert trained and all(m is model for m in trained)  # the eager original, never the compiled module
    for rule in ("non-foreach-optimizer", "no-mixed-precision"):
        assert isinstance(outcomes[rule].gain.what_if.rounds, tuple), outcomes[rule]
    assert "the gain credited here is, if anything, low" in outcomes["non-foreach-optimizer"].before[-1].text
    assert "its gain can differ" in outcomes["no-mixed-precision"].before[-1].text
    assert outcomes["conv-bias-before-bn"].gain is None
    assert "compiles its model" in outcomes["conv-bias-before-bn"].before[0].text


def test_plan_switches_the_budget_cannot_hold_say_the_budget_that_would(monkeypatch):
    """llm.c's fused AdamW read only "Not measured: the what-if time budget is spent"; the rule trials' findings
    said how much budget would time them, and now the plan's say it too."""
    import torch

    from turbotrain.doctor.requests import PlanRequest
    from turbotrain.doctor.whatif import common
    from turbotrain.plan import Plan

    monkeypatch.setattr(common, "optimizer_recipe", lambda ctx: (torch.optim.AdamW, {"lr": 1e-3}))
    monkeypatch.setattr(common, "baseline_plan", lambda ctx: Plan(device="cpu"))
    capture = SimpleNamespace(module=torch.nn.Linear(8, 1), args=(torch.randn(4, 8),), kwargs={})
    seconds = {"compute": 2.0, "python_overhead": 0.0, "optimizer": 0.0}  # a 2-s step: 15 s for the baseline alone
    ctx = SimpleNamespace(capture=capture, facts=SimpleNamespace(compiled=False), seconds=seconds.get,
                          backwards_per_step=lambda: 1.0, noise_floor=0.0, device="cpu")
    findings = [Finding(rule, "m", Fix(""), request=PlanRequest(changes))
                for rule, changes in (("non-foreach-optimizer", {"fused_optimizer": True}),
                                      ("no-mixed-precision", {"precision": "bf16-mixed"}))]
    whatif._run_what_ifs(ctx, findings, budget_s=5.0, allow_compile=False)
    for f in findings:
        assert f.what_if is None
        assert re.search(r"Not timed: its trial needed about 15 s and [45] s of the what-if budget were left; "
                         r"`--what-if-budget 20` gives it room\.$", f.note), f.note
