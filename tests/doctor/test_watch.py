"""tt.doctor.watch() around a loop kept in the caller's own code."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import turbotrain as tt


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def test_watch_ends_the_loop_after_the_steps_asked_and_reports():
    model, opt = _model()
    iterations = 0
    with tt.doctor.watch(steps=4, warmup=1, profile_steps=1, what_if=False, print_report=False) as doctor:
        for _ in range(1000):
            iterations += 1
            loss = model(torch.randn(8, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    report = doctor.report
    assert iterations == 6 and report.status == "ok"
    data = report.to_dict()
    assert data["steps_measured"] == 4 and data["script"].endswith("test_watch.py")
    assert sum(data["breakdown"].values()) == pytest.approx(1.0)


def test_syncs_in_the_callers_code_are_tied_to_its_lines():
    model, opt = _model()
    with tt.doctor.watch(warmup=1, profile_steps=0, what_if=False, print_report=False) as doctor:
        for _ in range(6):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            value = loss.item(); line = sys._getframe().f_lineno  # noqa: E702 - the sync and its line
            if loss > 100:
                print(value)
    rows = {(r.where, r.kind): r for r in doctor.report.syncs}
    assert rows[(f"test_watch.py:{line}", "item")].per_step == pytest.approx(1.0)
    assert rows[(f"test_watch.py:{line + 1}", "bool")].per_step == pytest.approx(1.0)
    assert {f.rule for f in doctor.report.findings} >= {"host-sync-in-loop"}


def test_manual_steps_for_a_loop_without_an_optimizer():
    model, _ = _model()
    with tt.doctor.watch(warmup=1, profile_steps=0, what_if=False, print_report=False) as doctor:
        for _ in range(5):
            model(torch.randn(8, 16)).pow(2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
            doctor.step()
    assert doctor.report.status == "ok" and doctor.report.to_dict()["steps_measured"] == 4


def test_an_error_in_the_block_is_reported_then_raised():
    model, opt = _model()
    holder = {}
    with pytest.raises(ValueError, match="bad batch"):
        with tt.doctor.watch(warmup=1, profile_steps=0, what_if=False, print_report=False) as doctor:
            holder["doctor"] = doctor
            for step in range(10):
                loss = model(torch.randn(8, 16)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if step == 3:
                    raise ValueError("bad batch")
    report = holder["doctor"].report
    assert report.status == "error" and report.to_dict()["error"]["where"].startswith("test_watch.py:")
    assert report.to_dict()["steps_completed"] == 4


def test_hooks_are_gone_after_the_block():
    before = (torch.Tensor.item, torch.save, torch.tensor, torch.autograd.backward)
    with tt.doctor.watch(steps=1, warmup=1, profile_steps=0, what_if=False, print_report=False):
        model, opt = _model()
        for _ in range(5):
            model(torch.randn(2, 16)).sum().backward()
            opt.step()
    assert (torch.Tensor.item, torch.save, torch.tensor, torch.autograd.backward) == before
    assert "item" not in torch.Tensor.__dict__
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks
    from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks
    assert not (_global_optimizer_pre_hooks or _global_optimizer_post_hooks or _global_forward_hooks
                or _global_forward_pre_hooks)
