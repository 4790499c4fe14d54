"""The search on injected trial results: greedy acceptance, the guard, never slower, the budget."""

from __future__ import annotations

import dataclasses

import pytest
from turbotrain.plan import Plan
from turbotrain.tuning.candidates import Candidates, Switch
from turbotrain.tuning.search import search_plan
from turbotrain.speedups.registry import Order

from tune_helpers import fake_trial

LOSSES = [2.3, 2.0, 1.8, 1.6, 1.5, 1.4, 1.3, 1.2, 1.1, 1.0, 0.9, 0.8, 0.7]

PRECISION = Switch("precision", "precision", ("bf16-mixed",), Order.MODEL_DTYPE)
LAYOUT = Switch("channels_last", "channels_last", (True,), Order.MODEL_LAYOUT)
FUSED = Switch("fused_optimizer", "fused_optimizer", (True,), Order.OPTIMIZER)
COMPILE = Switch("compile", "compile", (True,), Order.MODEL_COMPILE, expensive=True)


class FakeMeasure:
    """Step time = naive time x the factor of every switch the plan turns on (keyed by field)."""

    def __init__(self, factors, base_s=0.010, losses=None, compile_s=20.0, clock=None, errors=None):
        self.factors, self.base_s, self.compile_s = factors, base_s, compile_s
        self.losses = losses or {}
        self.errors = errors or {}
        self.clock = clock
        self.calls: list[Plan] = []

    def step_s(self, plan: Plan) -> float:
        t = self.base_s
        for field, value in plan.changes().items():
            t *= self.factors.get((field, value), 1.0)
        if plan.compile and plan.precision != "fp32":   # AMP + compile is better than either alone
            t *= self.factors.get("amp+compile", 1.0)
        return t

    def __call__(self, plan, steps, warmup):
        self.calls.append(plan)
        step = self.step_s(plan)
        warm = warmup * step + (self.compile_s if plan.compile else 0.0)
        if self.clock is not None:
            self.clock.now += warm + steps * step
        for field, value in plan.changes().items():
            if (field, value) in self.errors:
                return fake_trial(plan, step, [], error=self.errors[(field, value)])
        losses = LOSSES[:warmup + steps]
        for field, value in plan.changes().items():
            losses = self.losses.get((field, value), lambda ls: ls)(losses)
        return fake_trial(plan, step, losses, warmup_s=warm, steps=steps)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _rows(result):
    return {row.label: row for row in result.attempts}


def test_faster_switches_are_kept_and_slower_ones_rejected():
    measure = FakeMeasure({("precision", "bf16-mixed"): 0.7, ("fused_optimizer", True): 1.3})
    result = search_plan(measure, Candidates(timed=[PRECISION, FUSED]), time_budget_s=60)
    assert result.plan == Plan(precision="bf16-mixed")
    rows = _rows(result)
    assert rows["precision=bf16-mixed"].status == "accepted"
    assert rows["fused_optimizer=True"].status == "rejected"
    assert "not faster (0.7" in rows["fused_optimizer=True"].reason
    assert abs(result.speedup - 1 / 0.7) < 1e-6


def test_when_nothing_helps_it_says_so_and_returns_the_naive_plan():
    measure = FakeMeasure({("precision", "bf16-mixed"): 1.2, ("fused_optimizer", True): 1.01})
    result = search_plan(measure, Candidates(timed=[PRECISION, FUSED]), time_budget_s=60)
    assert result.plan == Plan()
    assert "nothing made this model faster" in result.message
    assert result.speedup == 1.0 and result.attempts[-1].status == "chosen"


def test_the_guard_rejects_a_fast_switch_that_breaks_numerics():
    measure = FakeMeasure({("precision", "bf16-mixed"): 0.5},
                          losses={("precision", "bf16-mixed"): lambda ls: [v * 1.5 for v in ls]})
    result = search_plan(measure, Candidates(timed=[PRECISION]), time_budget_s=60)
    row = _rows(result)["precision=bf16-mixed"]
    assert row.status == "rejected" and row.reason.startswith("numerics: loss off fp32 by 50.0%")
    assert result.plan == Plan()


def test_non_finite_and_failing_candidates_are_rejected_with_the_reason():
    measure = FakeMeasure({("precision", "bf16-mixed"): 0.5, ("channels_last", True): 0.5},
                          losses={("precision", "bf16-mixed"): lambda ls: ls[:2] + [float("inf")] + ls[3:]},
                          errors={("channels_last", True): "OutOfMemoryError: CUDA out of memory"})
    rows = _rows(search_plan(measure, Candidates(timed=[PRECISION, LAYOUT]), time_budget_s=60))
    assert "loss became inf at step 2" in rows["precision=bf16-mixed"].reason
    assert rows["channels_last=True"].reason == "failed: OutOfMemoryError: CUDA out of memory"


def test_compile_time_is_reported_apart_from_steady_state():
    measure = FakeMeasure({("compile", True): 0.5}, compile_s=25.0)
    result = search_plan(measure, Candidates(timed=[COMPILE]), time_budget_s=200)
    row = _rows(result)["compile=True"]
    assert row.status == "accepted"
    assert abs(row.compile_s - 25.0) < 1e-6                       # warm-up minus its steady-state share
    assert abs(row.samples_per_s - 32 / 0.005) < 1e-6             # steady state only
    assert abs(result.compile_s - 25.0) < 1e-6


def test_switches_are_flipped_again_under_compile():
    # bf16 alone is slower and channels_last alone faster, but under compile it is the other way round.
    measure = FakeMeasure({("precision", "bf16-mixed"): 1.1, ("channels_last", True): 0.8, ("compile", True): 0.6,
                           "amp+compile": 0.6})
    measure_layout = measure.step_s

    def step_s(plan):
        t = measure_layout(plan)
        return t * 1.6 if plan.compile and plan.channels_last else t   # layout hurts compiled kernels here
    measure.step_s = step_s
    result = search_plan(measure, Candidates(timed=[PRECISION, LAYOUT, COMPILE]), time_budget_s=600)
    assert result.plan == Plan(precision="bf16-mixed", compile=True)
    stages = {(row.label, row.status) for row in result.attempts if row.stage == "under-compile"}
    assert ("precision=bf16-mixed (under compile)", "accepted") in stages
    assert ("channels_last=False (under compile)", "accepted") in stages


def test_compile_is_skipped_when_the_budget_cannot_cover_it():
    clock = Clock()
    measure = FakeMeasure({("precision", "bf16-mixed"): 0.7, ("compile", True): 0.5}, base_s=0.1, clock=clock)
    result = search_plan(measure, Candidates(timed=[PRECISION, COMPILE]), time_budget_s=30, clock=clock)
    row = _rows(result)["compile=True"]
    assert row.status == "skipped" and row.reason.startswith("time budget")
    assert not any(p.compile for p in measure.calls)
    assert result.plan == Plan(precision="bf16-mixed")
    assert clock.now <= 30


def test_a_win_that_does_not_repeat_is_not_kept():
    measure = FakeMeasure({("fused_optimizer", True): 0.7})
    plain = measure.step_s
    seen = {"n": 0}

    def flaky(plan):
        if plan.fused_optimizer:
            seen["n"] += 1
            return plain(plan) if seen["n"] == 1 else 0.0125   # fast once (noise), slow after
        return plain(plan)
    measure.step_s = flaky
    result = search_plan(measure, Candidates(timed=[FUSED]), time_budget_s=60)
    row = _rows(result)["fused_optimizer=True"]
    assert row.status == "rejected" and "re-measured" in row.reason
    assert result.plan == Plan()


def test_the_final_side_by_side_check_falls_back_to_naive():
    measure = FakeMeasure({("fused_optimizer", True): 0.7})
    plain = measure.step_s

    def drifting(plan):   # the win disappears in the final side-by-side measurement
        return 0.05 if plan.fused_optimizer and measure.calls.count(plan) > 2 else plain(plan)
    measure.step_s = drifting
    result = search_plan(measure, Candidates(timed=[FUSED]), time_budget_s=60)
    assert result.plan == Plan()
    assert "measured 0.20x the naive plan side by side; returning the naive plan" in result.message


def test_speedups_are_paired_so_a_load_burst_on_the_baseline_does_not_inflate_them():
    measure = FakeMeasure({("precision", "bf16-mixed"): 0.7})
    plain = measure.step_s

    def burst(plan):   # the machine is 5x slower while the first two trials (the baseline) run
        return plain(plan) * (5 if len(measure.calls) <= 2 else 1)
    measure.step_s = burst
    result = search_plan(measure, Candidates(timed=[PRECISION]), time_budget_s=60)
    assert result.plan == Plan(precision="bf16-mixed")
    assert abs(result.speedup - 1 / 0.7) < 1e-6
    assert abs(_rows(result)["precision=bf16-mixed"].speedup - 1 / 0.7) < 1e-6


def test_a_pair_measured_through_a_burst_is_measured_again():
    measure = FakeMeasure({("fused_optimizer", True): 0.7})
    inner = measure.__call__

    def noisy_once(plan, steps, warmup):
        trial = inner(plan, steps, warmup)
        if plan.fused_optimizer and measure.calls.count(plan) == 1:   # first candidate trial: a burst
            trial.step_times_s = [t * (1 + 9 * (i % 2)) for i, t in enumerate(trial.step_times_s)]
        return trial
    result = search_plan(noisy_once, Candidates(timed=[FUSED]), time_budget_s=60)
    row = _rows(result)["fused_optimizer=True"]
    assert row.status == "accepted", row.reason
    assert measure.calls.count(Plan(fused_optimizer=True)) >= 2


def test_when_the_final_plan_loses_side_by_side_the_plan_before_it_is_checked():
    measure = FakeMeasure({("precision", "bf16-mixed"): 0.7, ("fused_optimizer", True): 0.9})
    plain = measure.step_s
    both = Plan(precision="bf16-mixed", fused_optimizer=True)

    def late_loss(plan):   # bf16 + fused wins while searching but not in the final check
        return 0.05 if plan == both and measure.calls.count(plan) > 2 else plain(plan)
    measure.step_s = late_loss
    result = search_plan(measure, Candidates(timed=[PRECISION, FUSED]), time_budget_s=60)
    assert result.plan == Plan(precision="bf16-mixed")
    assert abs(result.speedup - 1 / 0.7) < 1e-6
    assert result.message.startswith("1.43x the naive plan: precision=bf16-mixed (precision=bf16-mixed, "
                                     "fused_optimizer=True measured 0.20x the naive plan side by side)")


def test_with_no_time_left_to_check_earlier_plans_the_naive_plan_comes_back():
    clock = Clock()
    measure = FakeMeasure({("precision", "bf16-mixed"): 0.7, ("fused_optimizer", True): 0.9}, clock=clock)
    plain = measure.step_s
    both = Plan(precision="bf16-mixed", fused_optimizer=True)

    def late_loss(plan):
        if plan == both and measure.calls.count(plan) > 2:
            clock.now += 1000                      # the final check runs past the budget
            return 0.05
        return plain(plan)
    measure.step_s = late_loss
    result = search_plan(measure, Candidates(timed=[PRECISION, FUSED]), time_budget_s=60, clock=clock)
    assert result.plan == Plan() and result.speedup == 1.0
    assert result.message.endswith("measured 0.20x the naive plan side by side; returning the naive plan")


def test_a_close_loss_is_measured_again_and_a_third_pair_decides():
    """One pair reads a real 1.1x win as 0.91x (a load burst on the candidate): the search measures
    again, the two pairs disagree, and the third keeps the switch."""
    measure = FakeMeasure({("fused_optimizer", True): 1 / 1.1})
    plain = measure.step_s
    seen = {"n": 0}

    def burst_once(plan):
        if plan.fused_optimizer:
            seen["n"] += 1
            if seen["n"] == 1:
                return measure.base_s / 0.91
        return plain(plan)
    measure.step_s = burst_once
    result = search_plan(measure, Candidates(timed=[FUSED]), time_budget_s=60)
    row = _rows(result)["fused_optimizer=True"]
    assert row.status == "accepted", row.reason
    assert measure.calls.count(Plan(fused_optimizer=True)) >= 3
    assert result.plan == Plan(fused_optimizer=True)


def test_a_clear_loss_is_not_measured_again():
    measure = FakeMeasure({("fused_optimizer", True): 1.5})
    result = search_plan(measure, Candidates(timed=[FUSED]), time_budget_s=60)
    assert _rows(result)["fused_optimizer=True"].status == "rejected"
    assert measure.calls.count(Plan(fused_optimizer=True)) == 1


def test_a_compiled_candidate_is_measured_again_without_paying_for_a_second_compile():
    """After its first pair a compiled plan's graph is cached: measuring it again costs steps, not
    another compile, so a close first reading is checked even when a second compile would not fit."""
    clock = Clock()

    class CompileOnce(FakeMeasure):
        def __call__(self, plan, steps, warmup):
            self.compile_s = 50.0 if not any(p.compile for p in self.calls) else 0.0
            return super().__call__(plan, steps, warmup)

    measure = CompileOnce({("compile", True): 1 / 1.2}, base_s=0.1, clock=clock)
    plain = measure.step_s
    seen = {"n": 0}

    def slow_first(plan):   # the first compiled trial ran through a load burst: 0.95x
        if plan.compile:
            seen["n"] += 1
            if seen["n"] == 1:
                return 0.1 / 0.95
        return plain(plan)
    measure.step_s = slow_first
    result = search_plan(measure, Candidates(timed=[COMPILE]), time_budget_s=100, clock=clock)
    row = _rows(result)["compile=True"]
    assert measure.calls.count(Plan(compile=True)) >= 2, row.reason
    assert row.status == "accepted", row.reason


def test_switches_the_rules_recommend_are_timed_first():
    """With a budget for one candidate, it goes to the switch the registry's rule recommends."""
    clock = Clock()
    bias = Switch("drop_conv_bias", "drop_conv_bias", (True,), Order.MODEL_LAYOUT)
    precision = Switch("precision", "precision", ("bf16-mixed",), Order.MODEL_DTYPE, recommended=True)
    measure = FakeMeasure({("precision", "bf16-mixed"): 0.5, ("drop_conv_bias", True): 0.99}, base_s=0.1, clock=clock)
    search_plan(measure, Candidates(timed=[bias, precision]), time_budget_s=60, clock=clock)
    tried = [p for p in measure.calls if p != Plan()]
    assert tried and tried[0] == Plan(precision="bf16-mixed")


# -- from the rules' plan (issue 46): a synthetic GPU-like machine, through the measure seam ---------------

LOADERISH = [Switch(name, name, (True,), Order.OPTIMIZER, recommended=True)
             for name in ("cudnn_benchmark", "tf32", "fused_optimizer")]
RULE_PRECISION = Switch("precision", "precision", ("bf16-mixed", "fp16-mixed"), Order.MODEL_DTYPE,
                        recommended=True, rule_value="bf16-mixed")
RULE_COMPILE = Switch("compile", "compile", (True, "max-autotune-no-cudagraphs"), Order.MODEL_COMPILE,
                      expensive=True, recommended=True, rule_value=True)


class CompilesOnce(FakeMeasure):
    """A compiled plan pays its compile on its first trial only: later trials find the graph cached."""

    def __call__(self, plan, steps, warmup):
        cost, self.compile_s = self.compile_s, (self.compile_s if plan not in self.calls else 0.0)
        try:
            return super().__call__(plan, steps, warmup)
        finally:
            self.compile_s = cost


def _gpu_like(clock, **extra):
    """A ResNet-50-like step of 0.3 s: three small switches buy 1.08x each, bf16 3x, compile 1.5x after a
    40-s compile (another compile mode the same, after its own 40 s)."""
    factors = {("cudnn_benchmark", True): 1 / 1.08, ("tf32", True): 1 / 1.08, ("fused_optimizer", True): 1 / 1.08,
               ("precision", "bf16-mixed"): 1 / 3, ("precision", "fp16-mixed"): 1 / 2.9,
               ("compile", True): 1 / 1.5, ("compile", "max-autotune-no-cudagraphs"): 1 / 1.5, **extra}
    return CompilesOnce(factors, base_s=0.3, compile_s=40.0, clock=clock)


def test_from_the_rules_plan_a_60s_budget_finds_precision_and_compile():
    """The greedy walk from naive spent 60 s on the small switches and never reached bf16 or compile (the
    H100 bench's ResNet-50); starting from the rules' plan it keeps both and times little else."""
    clock = Clock()
    measure = _gpu_like(clock)
    result = search_plan(measure, Candidates(timed=[*LOADERISH, RULE_PRECISION, RULE_COMPILE]), time_budget_s=60,
                         clock=clock, device_type="cuda")
    assert result.plan.precision == "bf16-mixed" and result.plan.compile is True
    assert result.rules == result.plan and "(the rules' plan)" in result.message
    assert result.attempts[1].stage == "rules" and result.attempts[1].status == "accepted"
    assert result.speedup > 4
    assert clock.now <= 60 + 45   # one compile may overrun (it cannot be interrupted): never two


def test_a_rule_the_machine_disagrees_with_is_taken_out():
    """bf16 recommended by rule on a CPU where it is slower (17x on one AMD EPYC without bf16; 1.3x here):
    the rules' plan still beats naive through its fused optimizer, and the ablation takes bf16 out."""
    measure = FakeMeasure({("precision", "bf16-mixed"): 1.3, ("fused_optimizer", True): 0.5})
    rule_fused = dataclasses.replace(FUSED, recommended=True)
    rule_bf16 = dataclasses.replace(PRECISION, recommended=True)
    result = search_plan(measure, Candidates(timed=[rule_bf16, rule_fused]), time_budget_s=120)
    assert result.plan == Plan(fused_optimizer=True)
    rows = _rows(result)
    assert rows["without precision=bf16-mixed"].status == "accepted"
    assert rows["without fused_optimizer=True"].status == "rejected"
    assert result.attempts[1].stage == "rules" and result.attempts[1].status == "accepted"
    assert "precision=bf16-mixed" not in rows   # taken out by a measurement: not added back


def test_rules_that_lose_to_naive_leave_the_search_to_start_from_naive():
    measure = FakeMeasure({("precision", "bf16-mixed"): 4.0, ("fused_optimizer", True): 0.8})
    rule_bf16 = dataclasses.replace(PRECISION, recommended=True)
    result = search_plan(measure, Candidates(timed=[rule_bf16, FUSED]), time_budget_s=120)
    assert result.attempts[1].stage == "rules" and result.attempts[1].status == "rejected"
    assert result.plan == Plan(fused_optimizer=True) and result.rules == Plan(precision="bf16-mixed")


def test_a_budget_that_cannot_fit_compile_says_so_before_the_search():
    clock = Clock()
    measure = _gpu_like(clock)
    result = search_plan(measure, Candidates(timed=[*LOADERISH, RULE_PRECISION, RULE_COMPILE]), time_budget_s=20,
                         clock=clock, device_type="cuda")
    assert any("cannot time the rules' plan with compile" in note and "time_budget_s=" in note
               for note in result.notes)
    assert not any(p.compile for p in measure.calls)
    # What fitted was timed (the rules' plan without compile); compile stays as the rules pick it, said untimed:
    # dropping it for want of time would return a plan slower than Plan.fast.
    assert result.plan.precision == "bf16-mixed" and result.plan.compile == RULE_COMPILE.rules_pick
    assert any("kept untimed" in note for note in result.notes)
    assert clock.now <= 20


def test_the_search_never_returns_a_plan_the_rules_beat_side_by_side():
    """An addition wins its pair by noise, then loses to the rules' plan side by side: the rules' plan comes back."""
    clock = Clock()
    rule_fused = dataclasses.replace(FUSED, recommended=True)
    measure = FakeMeasure({("fused_optimizer", True): 0.5, ("channels_last", True): 1.0}, clock=clock)
    plain = measure.step_s
    lucky = Plan(fused_optimizer=True, channels_last=True)

    def noisy(plan):    # the layout reads 0.8x in its own pairs, and is really 1.3x slower
        if plan == lucky:
            return plain(plan) * (0.8 if measure.calls.count(plan) <= 2 else 1.3)
        return plain(plan)
    measure.step_s = noisy
    result = search_plan(measure, Candidates(timed=[rule_fused, LAYOUT]), time_budget_s=120, clock=clock)
    assert _rows(result)["channels_last=True"].status == "accepted"
    assert result.plan == Plan(fused_optimizer=True)
    assert "measured 0.77x the rules' plan side by side" in result.message


def test_a_rules_plan_not_believed_alone_comes_back_when_it_beats_the_chosen_plan_side_by_side():
    """The AVX2 EPYC's CNN: the rules' plan read 1.58x, then 1.10x naive, and was not kept; compile alone was, then
    measured 0.94x of the rules' plan side by side, and naive came back. The rules' plan is checked next instead."""
    rule_fused = dataclasses.replace(FUSED, recommended=True)
    measure = FakeMeasure({("fused_optimizer", True): 0.7, ("channels_last", True): 0.85})
    plain = measure.step_s
    rules, both = Plan(fused_optimizer=True), Plan(fused_optimizer=True, channels_last=True)

    def noisy(plan):  # the rules' plan's re-measures, and the layout added to it, run through bursts
        if (plan == rules and measure.calls.count(plan) in (2, 3)) or plan == both:
            return plain(Plan()) * 1.2
        return plain(plan)
    measure.step_s = noisy
    result = search_plan(measure, Candidates(timed=[rule_fused, LAYOUT]), time_budget_s=120)
    assert _rows(result)["rules: fused_optimizer=True"].status == "rejected"
    assert _rows(result)["channels_last=True"].status == "accepted"
    assert result.plan == rules, result.message
    assert "channels_last=True measured 0.82x the rules' plan side by side" in result.message, result.message
    assert result.message.startswith("1.43x the naive plan: fused_optimizer=True (the rules' plan)"), result.message


@pytest.mark.parametrize("run_steps, kept", [(300, False), (50_000, True)])
def test_compile_is_judged_over_the_run_and_says_when_it_pays(run_steps, kept):
    """Compile costs 40 s and saves 0.1 s a step (0.3 -> 0.2 s): it pays after 400 steps."""
    clock = Clock()
    measure = CompilesOnce({("compile", True): 2 / 3}, base_s=0.3, compile_s=40.0, clock=clock)
    result = search_plan(measure, Candidates(timed=[COMPILE]), time_budget_s=300, clock=clock, run_steps=run_steps)
    row = _rows(result)["compile=True"]
    assert row.pays_after_steps == pytest.approx(400, rel=0.01)
    assert (result.plan.compile is True) == kept
    if not kept:
        assert row.status == "rejected"
        said = "compile costs 40.0 s and saves 100.00 ms a step: it pays after 400 steps; this run has 300"
        assert said in row.reason


def test_without_a_budget_one_is_derived_from_the_naive_step():
    clock = Clock()
    measure = _gpu_like(clock)
    result = search_plan(measure, Candidates(timed=[*LOADERISH, RULE_PRECISION, RULE_COMPILE]), time_budget_s=None,
                         clock=clock, device_type="cuda")
    assert result.budget_s > 60 and result.notes[0].startswith(f"budget: {result.budget_s:.0f}s, derived from")
    assert result.plan.precision == "bf16-mixed" and result.plan.compile is not False
    # the derived budget had room for the other compile mode and fp16 too
    labels = {row.label for row in result.attempts}
    assert "compile=max-autotune-no-cudagraphs" in labels and "precision=fp16-mixed" in labels


# -- a CPU like the 2-core AVX2-only EPYC (2026-11-30): the rules pick a fused optimizer that buys nothing, bf16 is
# emulated and slow, one thread loses, and compile alone buys 1.15x after a cold compile the budget barely holds.

THREADS = Switch("intra_op_threads", "intra_op_threads", (1,), Order.OPTIMIZER)


def _avx2_like(clock):
    factors = {("fused_optimizer", True): 1.0, ("intra_op_threads", 1): 1.4, ("precision", "bf16-mixed"): 3.0,
               ("compile", True): 1 / 1.15}
    return CompilesOnce(factors, base_s=0.125, compile_s=35.0, clock=clock)


def _avx2_candidates():
    return Candidates(timed=[dataclasses.replace(FUSED, recommended=True), THREADS, PRECISION, COMPILE])


def test_an_addition_that_is_the_rules_plan_is_not_timed_again():
    clock = Clock()
    measure = _avx2_like(clock)
    result = search_plan(measure, _avx2_candidates(), time_budget_s=300, clock=clock)
    rows = [row.label for row in result.attempts]
    assert rows[1] == "rules: fused_optimizer=True" and result.attempts[1].status == "rejected"
    assert "fused_optimizer=True" not in rows, rows
    # Before compile, the rules' row's two pairs (1.00x, a close call measured again) are the only times it ran
    # (after, the final check times it beside the chosen plan: never slower than the rules).
    before = measure.calls[:measure.calls.index(Plan(compile=True))]
    assert before.count(Plan(fused_optimizer=True)) == 2
    assert result.plan.compile is True


def test_compile_is_timed_before_the_cheap_switches_when_the_budget_cannot_hold_both():
    """A 100-s budget: the rules' pairs, then one thread and bf16 (losses, each a pair) left too little for a
    cold compile, and the tuner returned naive where compile alone is 1.15x. Compile goes first now."""
    clock = Clock()
    measure = _avx2_like(clock)
    result = search_plan(measure, _avx2_candidates(), time_budget_s=100, clock=clock)
    assert result.plan == Plan(compile=True), [(r.label, r.status, r.reason) for r in result.attempts]
    compiled = measure.calls.index(Plan(compile=True))
    assert Plan(intra_op_threads=1) not in measure.calls[:compiled]
    assert Plan(precision="bf16-mixed") not in measure.calls[:compiled]
    assert clock.now <= 100 + 40  # one compile may overrun (it cannot be interrupted): never two


def test_a_budget_too_small_for_compile_says_so_with_the_budget_that_times_it():
    clock = Clock()
    measure = _avx2_like(clock)
    result = search_plan(measure, _avx2_candidates(), time_budget_s=40, clock=clock)
    assert not any(p.compile for p in measure.calls)
    (note,) = [n for n in result.notes if n.startswith("compile was not timed within the 40s budget (~")]
    wanted = int(note.split("time_budget_s=")[1].split()[0])
    assert wanted > 40
    # That budget does time it, and compile is what it finds.
    clock = Clock()
    measure = _avx2_like(clock)
    result = search_plan(measure, _avx2_candidates(), time_budget_s=wanted, clock=clock)
    assert result.plan.compile is True, [(r.label, r.status, r.reason) for r in result.attempts]


def test_a_rules_compile_that_buys_nothing_beyond_noise_is_taken_out():
    """The rules pick compile and it ties (1.01x): kept, it would cost its compile on every run for nothing, and the
    chosen row would say compile pays after never. It must win as an addition must, or it goes."""
    clock = Clock()
    measure = CompilesOnce({("fused_optimizer", True): 0.5, ("compile", True): 1 / 1.01}, base_s=0.1, compile_s=30.0,
                           clock=clock)
    rule_fused = dataclasses.replace(FUSED, recommended=True)
    result = search_plan(measure, Candidates(timed=[rule_fused, RULE_COMPILE]), time_budget_s=600, clock=clock)
    row = _rows(result)["without compile=True"]
    assert row.status == "accepted", row.reason
    assert "compile bought nothing beyond noise a step (1.01x with it) for its 30.0 s compile" in row.reason
    assert result.plan == Plan(fused_optimizer=True), result.message


def test_a_rules_compile_that_wins_beyond_noise_stays():
    clock = Clock()
    measure = CompilesOnce({("fused_optimizer", True): 0.5, ("compile", True): 1 / 1.05}, base_s=0.1, compile_s=30.0,
                           clock=clock)
    rule_fused = dataclasses.replace(FUSED, recommended=True)
    result = search_plan(measure, Candidates(timed=[rule_fused, RULE_COMPILE]), time_budget_s=600, clock=clock)
    assert _rows(result)["without compile=True"].status == "rejected"
    assert result.plan == Plan(fused_optimizer=True, compile=True), result.message
