"""run_trial's early stop (give_up_s): a candidate whose steps are all slow is stopped after two of them, while
one step a loaded machine held back does not stop a candidate that is otherwise as fast as its baseline."""

from __future__ import annotations

import time

import torch
from torch import nn

from turbotrain.measure import HOPELESS_FLOOR_S, HOPELESS_STEPS, run_trial
from turbotrain.plan import Plan

HELD_BACK_S = HOPELESS_FLOOR_S + 0.05


class _HeldBack(nn.Module):
    """A linear layer whose forward, on the calls listed, waits past the early stop's floor."""

    def __init__(self, slow_calls: set[int] | None = None, slow_from: int | None = None):
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.slow_calls, self.slow_from, self.calls = slow_calls or set(), slow_from, 0

    def forward(self, x):
        if self.calls in self.slow_calls or (self.slow_from is not None and self.calls >= self.slow_from):
            time.sleep(HELD_BACK_S)
        self.calls += 1
        return self.inner(x)


def _trial(model: nn.Module, steps: int = 8):
    batches = [(torch.randn(4, 8), torch.randn(4, 8))]
    return run_trial(model, lambda p: torch.optim.SGD(p, lr=0.1), nn.functional.mse_loss, batches, Plan(),
                     steps=steps, warmup=1, give_up_s=0.01)


def test_a_candidate_slow_at_every_step_is_stopped_after_two_of_them():
    trial = _trial(_HeldBack(slow_from=1))
    assert trial.stopped_early and not trial.ok
    assert len(trial.losses) == 1 + HOPELESS_STEPS  # the warm-up step, then the slow ones that stopped it
    assert trial.error.startswith(f"stopped early: {HOPELESS_STEPS} steps took")


def test_one_step_held_back_does_not_stop_the_trial():
    trial = _trial(_HeldBack(slow_calls={3}))
    assert trial.ok and not trial.stopped_early
    assert len(trial.step_times_s) == 8 and max(trial.step_times_s) >= HELD_BACK_S


def test_a_compiled_candidate_slow_after_its_warm_up_is_stopped_too():
    """bf16 under compile on a CPU without bf16 instructions ran 17x a step and was timed to the end, 7 s past the
    tuner's budget: a compiled plan's steps after its warm-up (where it compiles) are judged like an eager one's."""
    warmup, calls = 2, []

    def step_fn(model, batch):  # outside the compiled module: no guard sees the counter
        calls.append(1)
        if len(calls) > warmup:
            time.sleep(HELD_BACK_S)
        x, y = batch
        return nn.functional.mse_loss(model(x), y)

    batches = [(torch.randn(4, 8), torch.randn(4, 8))]
    trial = run_trial(nn.Linear(8, 8), lambda p: torch.optim.SGD(p, lr=0.1), None, batches, Plan(compile=True),
                      steps=8, warmup=warmup, step_fn=step_fn, give_up_s=0.01)
    assert trial.stopped_early and not trial.ok, trial.error
    assert len(trial.losses) == warmup + HOPELESS_STEPS
