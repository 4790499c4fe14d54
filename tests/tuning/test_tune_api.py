"""tt.tune end to end on a tiny model (compile left out: CPU compiles take tens of seconds)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch
from torch import nn

import turbotrain as tt
from turbotrain.speedups import registry
from turbotrain.tuning import api, tune_report

from tune_helpers import adamw, loss_fn, tiny_loader, tiny_mlp


class _Wrapped(nn.Module):
    def __init__(self, inner: nn.Module, scale: float = 1.0, extra_passes: int = 0):
        super().__init__()
        self.inner, self.scale, self.extra_passes = inner, scale, extra_passes

    def forward(self, x):
        # Slowness as more of the step's own work, not a sleep: on a loaded machine work slows with the load,
        # as both sides of a pair do, while a sleeper wakes ahead of busy processes and a fixed delay drowns
        # in steps the load stretched (a CI run accepted a 10 ms sleep).
        with torch.no_grad():
            for _ in range(self.extra_passes):
                self.inner(x)
        return self.inner(x) * self.scale


def _inject(monkeypatch, name: str, **wrap) -> None:
    """Make registry switch ``name`` also wrap the model: a switch that breaks numerics or is slow."""
    entry = registry.get(name)

    def apply(rt):
        entry.apply(rt)
        rt.model = _Wrapped(rt.model, **wrap)
    monkeypatch.setitem(registry._REGISTRY, name, dataclasses.replace(entry, apply=apply))


def _tune(**options):
    options.setdefault("verbose", False)
    return tune_report(tiny_mlp(), loss_fn, tiny_loader(), adamw, 30, **options)


def _row(result, change):
    """The row that timed ``change`` on the naive plan: its own, or the rules' plan's where the rules pick just that
    (the search does not time one pair twice)."""
    return next(r for r in result.search.attempts if r.label in (change, f"rules: {change}"))


def test_a_switch_that_breaks_numerics_is_rejected_with_the_reason(monkeypatch):
    _inject(monkeypatch, "fused_optimizer", scale=3.0)
    result = _tune(include=("fused_optimizer",), find_num_workers=False)
    row = _row(result, "fused_optimizer=True")
    assert row.status == "rejected" and row.reason.startswith("numerics: loss off fp32 by")
    assert result.plan.fused_optimizer is False


def test_a_switch_that_makes_the_loss_non_finite_is_rejected(monkeypatch):
    _inject(monkeypatch, "fused_optimizer", scale=float("nan"))
    row = _row(_tune(include=("fused_optimizer",), find_num_workers=False), "fused_optimizer=True")
    assert row.status == "rejected" and "loss became nan at step 0" in row.reason


def test_a_forced_slow_switch_is_rejected_and_with_nothing_else_the_naive_plan_comes_back(monkeypatch):
    _inject(monkeypatch, "fused_optimizer", extra_passes=50)   # 3-5x a tiny MLP step's work
    result = _tune(include=("fused_optimizer",), find_num_workers=False)
    row = _row(result, "fused_optimizer=True")
    assert row.status == "rejected" and row.reason.startswith("not faster")
    assert result.plan == tt.Plan()
    assert "nothing made this model faster" in result.search.message


def test_model_optimizer_and_every_rng_are_bitwise_unchanged_by_tune():
    model, loader = tiny_mlp(), tiny_loader()
    optimizer = adamw(model.parameters())
    x, y = next(iter(loader))
    loss_fn(model(x), y).backward()
    optimizer.step()                                   # optimizer state exists (exp_avg, step)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    before = (
        {k: v.clone() for k, v in model.state_dict().items()},
        {k: {n: t.clone() if torch.is_tensor(t) else t for n, t in s.items()}
         for k, s in optimizer.state_dict()["state"].items()},
        random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state(),
        loader.generator.get_state(), torch.backends.cudnn.benchmark,
    )
    tt.tune(model, loss_fn, loader, adamw, 30, exclude=("compile",), verbose=False)
    after_state = model.state_dict()
    assert all(torch.equal(before[0][k], after_state[k]) for k in before[0])
    after_opt = optimizer.state_dict()["state"]
    for k, s in before[1].items():
        assert all(torch.equal(t, after_opt[k][n]) if torch.is_tensor(t) else t == after_opt[k][n]
                   for n, t in s.items())
    assert random.getstate() == before[2]
    assert np.array_equal(np.random.get_state()[1], before[3])
    assert torch.equal(torch.get_rng_state(), before[4])
    assert torch.equal(loader.generator.get_state(), before[5])
    assert torch.backends.cudnn.benchmark == before[6]


def test_tune_returns_a_plan_the_trainer_applies_and_prints_the_table(capsys):
    model, loader = tiny_mlp(), tiny_loader()
    plan = tt.tune(model, loss_fn, loader, adamw, 30, exclude=("compile",))
    assert isinstance(plan, tt.Plan)
    out = capsys.readouterr().out
    for column in ("candidate", "samples/s", "vs naive", "peak mem", "compile s", "verdict"):
        assert column in out
    assert "num_workers finder" in out
    result = tt.Trainer(model, adamw(model.parameters()), loss_fn, plan=plan, max_steps=3, progress=False).fit(loader)
    assert result.steps == 3 and result.plan == plan


def test_a_second_call_is_answered_from_the_cache_without_timing_anything(monkeypatch, isolated_cache):
    first = _tune(exclude=("compile",))
    assert not first.from_cache and len(list(isolated_cache.glob("*.json"))) == 1

    def no_trials(*args, **kwargs):
        raise AssertionError("a cached tune must not run trials")
    monkeypatch.setattr(api, "run_trial", no_trials)
    monkeypatch.setattr(api.workers_finder, "find_num_workers", no_trials)
    second = _tune(exclude=("compile",))
    assert second.from_cache and second.plan == first.plan
    assert [r.label for r in second.search.attempts] == [r.label for r in first.search.attempts]
    # Another input shape is another entry: it is tuned (here: refused, trials are disabled).
    with pytest.raises(AssertionError, match="must not run trials"):
        tune_report(tiny_mlp(), loss_fn, tiny_loader(batch_size=16), adamw, 30, exclude=("compile",), verbose=False)


def test_cache_key_follows_structure_shape_and_options_not_weights():
    from turbotrain.hardware import detect
    from turbotrain.tuning.cache import cache_key

    hw, batch = detect("cpu"), next(iter(tiny_loader()))
    key = cache_key(tiny_mlp(0), batch, adamw, loss_fn, hw, {"budget": 30})
    assert key == cache_key(tiny_mlp(1), batch, adamw, loss_fn, hw, {"budget": 30})      # other weights
    assert key != cache_key(nn.Sequential(nn.Linear(32, 10)), batch, adamw, loss_fn, hw, {"budget": 30})
    assert key != cache_key(tiny_mlp(0), [batch[0][:8], batch[1][:8]], adamw, loss_fn, hw, {"budget": 30})
    assert key != cache_key(tiny_mlp(0), batch, adamw, loss_fn, hw, {"budget": 60})
    assert key != cache_key(tiny_mlp(0), batch, lambda p: torch.optim.SGD(p, lr=0.1), loss_fn, hw, {"budget": 30})
    assert key != cache_key(tiny_mlp(0), batch, adamw, loss_fn, dataclasses.replace(hw, cpu_cores=64),
                            {"budget": 30})


def test_compile_is_timed_with_its_compile_time_reported_apart():
    """The one real compile in the default suite: a tiny MLP, compile only."""
    result = tune_report(tiny_mlp(), loss_fn, tiny_loader(), adamw, 120, include=("compile",),
                         find_num_workers=False, verbose=False)
    row = _row(result, "compile=True")
    assert row.status in ("accepted", "rejected"), row.reason
    # Inductor's on-disk cache can make a repeat compile take well under a second, so no floor here.
    assert row.compile_s is not None and row.compile_s > 0
    assert row.step_s * 10 < row.compile_s                        # steady state is timed apart from it
