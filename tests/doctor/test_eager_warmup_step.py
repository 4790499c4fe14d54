"""A model the script calls only inside a function it compiled runs there without any module hook: the recorder runs
warm-up eagerly until the model is seen called, then lets the compiled code run again, from its cache, before the
window opens. A plain loop closes its step at ``optimizer.step()``, after the step's forward, so the first step run
eagerly is the one after the boundary that asked for it (Lightning's boundary comes before its forward:
tests/doctor/test_corpus.py, ``lightning_compiled``)."""

from __future__ import annotations

import textwrap

import pytest

from turbotrain.doctor.analysis.context import build_context
from turbotrain.doctor.record.recorder import Recorder
from turbotrain.doctor.record.runner import run_script

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

SCRIPT = """
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 4)

        def forward(self, x):
            return self.down(nn.functional.gelu(self.up(x)))


    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    {compiled}

    for step in range(40):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        loss = loss_of(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
# The loss function compiled, or the model compiled in place (module.compile(): its own call runs compiled, where
# its hooks and its children's are traced too).
COMPILED = {
    "function": "@torch.compile\n    def loss_of(x, y):\n        return nn.functional.cross_entropy(model(x), y)",
    "in-place": "model.compile()\n    def loss_of(x, y):\n        return nn.functional.cross_entropy(model(x), y)",
}


@pytest.mark.parametrize("compiled", sorted(COMPILED))
def test_a_model_called_inside_compiled_code_is_found_before_the_window_opens(tmp_path, compiled):
    from torch._dynamo import eval_frame

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(compiled=COMPILED[compiled])))
    recorder = Recorder(measure=3, warmup=2, profile=1)
    run = run_script(script, [], recorder)
    assert run.status == "stopped", run
    ctx = build_context(recorder.recording(), recorder.live_objects(), str(script))
    assert ctx.capture is not None and type(ctx.capture.module).__name__ == "Net", ctx.capture
    assert ctx.capture.args[0].shape == (8, 16) and ctx.facts.compiled
    # The eager forward came in the third step: warm-up grew by one, so that the window holds compiled steps only.
    assert recorder.schedule.warmup == 3
    compiled = ctx.compiled
    assert compiled is not None and compiled.graphs == 1 and compiled.recompiles == 0, compiled
    assert compiled.in_graphs is not None and compiled.in_graphs.forward_ms > 0, compiled.in_graphs
    assert eval_frame._stance.stance == "default"
