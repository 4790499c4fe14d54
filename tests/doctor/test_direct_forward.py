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
