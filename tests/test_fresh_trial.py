"""A Plan trained in a process of its own (turbotrain.fresh_trial): the user's classes found without running
their training, the plan applied there, failures reported with their cause, no process left behind; and
the page faults a trial's steps take, which decide when the doctor needs such a process."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch

from turbotrain.fresh_trial import FreshTrial, FreshTrialError, write_bundle
from turbotrain.measure import run_trial
from turbotrain.plan import Plan

SCRIPT = textwrap.dedent('''
    import pathlib
    import torch
    from torch import nn

    WIDTH = 16


    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(WIDTH, WIDTH)

        def forward(self, x):
            return self.inner(x) * 2


    def mean_square(model, batch):
        return model(batch).pow(2).mean()


    pathlib.Path(__file__).with_name("training-ran").write_text("yes")
    if __name__ == "__main__":
        raise SystemExit("the training loop must not run in a trial process")
''')


@pytest.fixture
def script_module(tmp_path, monkeypatch):
    """The script's definitions imported as ``__main__`` here (as the doctor's process has them)."""
    import runpy
    import sys
    import types

    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    defs = runpy.run_path(str(path), run_name="not_main")  # writes the marker here, not in the child
    (tmp_path / "training-ran").unlink()
    main = types.ModuleType("__main__")
    main.__dict__.update(defs)
    defs["Scaled"].__module__ = "__main__"
    monkeypatch.setitem(sys.modules, "__main__", main)
    return path, defs


def test_a_model_defined_in_the_script_trains_in_its_own_process(tmp_path, script_module):
    path, defs = script_module
    bundle = str(tmp_path / "bundle.pt")
    defs["mean_square"].__module__ = "__main__"
    write_bundle(bundle, defs["Scaled"](), [torch.randn(8, 16)], (torch.optim.SGD, {"lr": 0.1}),
                 defs["mean_square"], threads=1)
    with FreshTrial(bundle, Plan(device="cpu", precision="bf16-mixed"), script=str(path), warmup=1) as child:
        ready = child.ready()
        times = child.steps(4)
        pid = child._proc.pid
        assert child._proc.poll() is None and pid != os.getpid()
    assert "precision" in ready["applied"], ready
    assert len(times) == 4 and all(t > 0 for t in times)
    assert child._proc.poll() is not None  # the process ended with the block
    assert not (tmp_path / "training-ran").exists()  # definitions only, not the script's loop


def test_a_class_it_cannot_find_is_an_error_naming_it(tmp_path, script_module):
    _, defs = script_module
    bundle = str(tmp_path / "bundle.pt")
    write_bundle(bundle, defs["Scaled"](), [torch.randn(8, 16)], (torch.optim.SGD, {"lr": 0.1}), torch.sum)
    child = FreshTrial(bundle, Plan(device="cpu"), script=None, warmup=1)
    with pytest.raises(FreshTrialError, match="Scaled"):
        child.ready()
    child.close()
    assert child._proc.poll() is not None


def test_a_trial_counts_the_page_faults_of_its_steps():
    """A step that maps 64 MiB of fresh memory and touches every page (an anonymous mmap, so the count does not
    depend on what malloc kept from earlier tests) faults those pages in every step; the same step without it
    does not come close."""
    import mmap

    import numpy as np

    model = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)

    def churning(m, batch):
        region = mmap.mmap(-1, 64 << 20)
        pages = np.frombuffer(region, dtype=np.uint8)
        pages[::4096] = 1  # first touch of each page: one fault each
        del pages
        region.close()  # handed back to the system: the next step faults them in again
        return m(batch).sum()

    plain = run_trial(model, lambda p: torch.optim.SGD(p, lr=0.1), None, [x], Plan(device="cpu"), steps=4,
                      warmup=1, step_fn=lambda m, b: m(b).sum())
    churn = run_trial(model, lambda p: torch.optim.SGD(p, lr=0.1), None, [x], Plan(device="cpu"), steps=4,
                      warmup=1, step_fn=churning)
    assert churn.page_faults_per_step >= 16  # 2 MiB pages where the kernel gives huge pages: 32 a step
    assert plain.page_faults_per_step < churn.page_faults_per_step / 4


@pytest.mark.parametrize("before_backward", [False, True])
def test_a_step_clears_gradients_where_it_is_told_and_trains_the_same(before_backward):
    """Cleared after the optimizer step, the gradients are gone when the next forward runs; cleared before
    the backward, the last step's are still there during it. Either way the model trains the same."""
    from turbotrain.measure import _train_step
    from turbotrain.runtime import prepare

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    rt = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), Plan(device="cpu"))
    x = torch.randn(8, 4)
    grads_at_forward = []

    def step(m, batch):
        grads_at_forward.append(m.weight.grad is not None)
        return m(batch).pow(2).mean()

    losses = [_train_step(rt, [x], None, step, before_backward) for _ in range(3)]
    assert grads_at_forward == [False, before_backward, before_backward]

    torch.manual_seed(0)
    twin = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    expected = []
    for _ in range(3):
        loss = twin(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        expected.append(loss.item())
    assert losses == pytest.approx(expected, rel=0, abs=0)
    assert torch.equal(model.weight, twin.weight)
