"""A script that calls ``model.forward(x)`` (no ``__call__``, so no module hook sees the model): the doctor captures the
model, not the first child its forward calls, and the forward still runs once per call, as written."""

from __future__ import annotations

import runpy
import textwrap

import pytest
import torch

from turbotrain.doctor.record.recorder import Recorder
from turbotrain.doctor.record.runner import run_script

pytestmark = pytest.mark.reads_no_time  # it reads what was captured and counted, never a time

SCRIPT = """
import torch
from torch import nn

CALLS, STEPS = [], []


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        CALLS.append("Net")
        return self.head(self._features(x))

    def _features(self, x):  # the child is called from a helper of the forward
        return self.body(x)


class Doubled(Net):
    def forward(self, x):
        return super().forward(x) * 2  # Net.forward reached as a subclass's super(): not routed again


def train(model, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(0)
    for step in range(steps):
        STEPS.append(1)
        if step == 3:  # torch.fx calls the forward itself, reading its signature
            assert "head" in str(torch.fx.symbolic_trace(model).graph)
        loss = model.forward(torch.randn(4, 8)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


model = {model}()
train(model, 8)
"""


@pytest.mark.parametrize("model", ["Net", "Doubled"])
def test_a_forward_called_directly_is_captured_as_the_model_and_runs_once(tmp_path, model):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT.format(model=model)))
    recorder = Recorder(measure=3, warmup=2, profile=0, watch_s=0)
    run_script(str(path), [], recorder)
    capture = recorder.live_objects().capture
    assert capture is not None and type(capture.module).__name__ == model, capture
    assert tuple(capture.args[0].shape) == (4, 8) and capture.site.function == "train"  # the line that calls it
    # One training forward a step (the model's), not one per child its forward calls.
    assert [step.forwards for step in recorder.recording().steps] == [1] * len(recorder.recording().steps)
    script = type(capture.module).__init__.__globals__  # the script's namespace
    # One Net.forward per step (and the trace's): the routed call did not run the forward twice.
    assert len(script["STEPS"]) >= 5 and script["CALLS"] == ["Net"] * (len(script["STEPS"]) + 1)
    # The class is itself again after the recording, and trains as it does without the doctor.
    assert all(vars(script[name])["forward"].__code__.co_filename == str(path) for name in ("Net", model))
    (tmp_path / "plain.py").write_text(textwrap.dedent(SCRIPT.format(model=model)).replace("train(model, 8)", ""))
    plain = runpy.run_path(str(tmp_path / "plain.py"))
    losses = []
    for names in (script, plain):
        torch.manual_seed(1)
        losses.append(names["train"](names[model](), 3))
    assert losses[0] == losses[1]


class _Twice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.shape[0] > 2:  # a forward that calls itself on chunks
            return torch.cat([self.forward(part) for part in x.split(2)])
        return self.body(x)


def test_a_routed_forward_runs_each_call_once_and_leaves_hooks_and_own_calls_alone():
    """The wrapper a routed class gets: a call through `model(x)` where torch runs the forward from its hooks' inner
    function, a forward calling itself on chunks, a model with hooks of its own: the forward runs as written, each
    hook once."""
    from turbotrain.doctor.record import instrument
    from turbotrain.doctor.record.patcher import Patcher
    from torch.nn.modules.module import register_module_forward_hook

    calls: list[int] = []
    model, x = _Twice(), torch.randn(6, 4)
    expected = model(x)
    patcher = Patcher()
    patcher.replace(_Twice, "forward", instrument.direct_forward)
    handle = register_module_forward_hook(lambda m, args, out: calls.append(id(m)))  # torch's inner path
    try:
        assert torch.equal(model(x), expected) and calls.count(id(model)) == 1, calls  # not routed again
        calls.clear()
        assert torch.equal(model.forward(x), expected) and calls.count(id(model)) == 1, calls  # routed: one call
        own: list[int] = []
        model.register_forward_pre_hook(lambda m, args: own.append(1))
        calls.clear()
        model.forward(x)  # the script skips its model's own hooks: still skipped
        assert own == [] and calls.count(id(model)) == 0, (own, calls)
    finally:
        handle.remove()
        patcher.restore()
    assert "forward" in vars(_Twice) and vars(_Twice)["forward"].__code__.co_filename == __file__


OWN_CALL = """
import sys

import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 1)

    def __call__(self, x):  # a __call__ of its own that calls forward: routing it would scale twice
        return self.forward(x * 2)

    def forward(self, x):
        return self.body(x)


torch.manual_seed(0)
model = Scaled()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(8):
    loss = model(torch.randn(8, 4)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with open(sys.argv[1], "a") as losses:
        losses.write(f"{loss.item()!r}\\n")
"""


def test_a_class_with_a_call_of_its_own_is_not_routed(tmp_path, monkeypatch):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(OWN_CALL))
    doctor, plain = tmp_path / "doctor.txt", tmp_path / "plain.txt"
    run_script(str(path), [str(doctor)], Recorder(measure=3, warmup=2, profile=0, watch_s=0))
    monkeypatch.setattr("sys.argv", [str(path), str(plain)])
    runpy.run_path(str(path), run_name="__main__")
    under = doctor.read_text().split()
    assert len(under) >= 3 and under == plain.read_text().split()[: len(under)]
