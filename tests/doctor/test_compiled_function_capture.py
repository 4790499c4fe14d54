"""A model the script calls only inside a function it compiled (Lightning compiles ``training_step`` when handed a
compiled LightningModule): the graph runs its modules without any module hook, so the doctor runs one warm-up step
eagerly to find the model and its batch, then lets the compiled code run again, from its cache."""

from __future__ import annotations

import pytest
import torch

from doctor_helpers import script
from turbotrain.doctor.analysis.context import build_context
from turbotrain.doctor.record.recorder import Recorder
from turbotrain.doctor.record.runner import run_script

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane


def test_a_model_called_only_inside_compiled_code_is_found_in_one_eager_warm_up_step():
    pytest.importorskip("lightning", reason="lightning is in the test extra: pip install -e '.[test]'")
    from torch._dynamo import eval_frame

    recorder = Recorder(measure=3, warmup=2, profile=1)
    run = run_script(script("lightning_compiled"), [], recorder)
    assert run.status == "stopped", run
    ctx = build_context(recorder.recording(), recorder.live_objects(), script("lightning_compiled"))
    # The model is the body training_step calls, with the training batch, known to run compiled.
    assert ctx.capture is not None and isinstance(ctx.capture.module, torch.nn.Sequential), ctx.capture
    assert ctx.capture.args[0].shape == (32, 64)
    assert ctx.facts.compiled
    # The eager step compiled nothing and left no guard to fail: one graph, no recompile, and the profiled step
    # after the window ran in it.
    compiled = ctx.compiled
    assert compiled is not None and compiled.graphs == 1 and compiled.recompiles == 0, compiled
    assert compiled.in_graphs is not None and compiled.in_graphs.forward_ms > 0, compiled.in_graphs
    assert eval_frame._stance.stance == "default"
    # No step lost its optimizer step to the eager one.
    assert [s.optimizers for s in recorder.steps] == [1] * len(recorder.steps)
