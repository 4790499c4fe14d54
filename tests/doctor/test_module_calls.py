"""The module calls a step makes, which size its profiler window, are the training step's: an evaluation under
no_grad in the first step (nanoGPT evaluates 400 batches at iteration 0) must not leave the window out."""

from __future__ import annotations

import textwrap

import pytest

from turbotrain.doctor.record.recorder import Recorder
from turbotrain.doctor.record.runner import run_script

pytestmark = pytest.mark.reads_no_time  # it reads counts, never a time

SCRIPT = """
import torch

model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for it in range(12):
    if it == 0:
        with torch.no_grad():
            for _ in range({evals}):
                model(torch.randn(2, 4))
    loss = model(torch.randn(2, 4)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_an_evaluation_in_the_first_step_is_not_counted_as_the_steps_module_calls(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT.format(evals=1000)))  # 4,000 module calls: 520,000 events
    recorder = Recorder(measure=3, warmup=2, profile=1, watch_s=0)
    run_script(str(path), [], recorder)
    recording = recorder.recording()
    assert recording.module_calls_per_step == 4  # the Sequential and its three layers, once
    assert recording.window.profiler_ran and recording.window.profile_left_out == 0
