"""compile-loss-eager: a loss computed on a compiled graph's output outside the graph is caught while recording
(which loss, at which line, through which eager ops), named at that line, and timed against the model and the loss
compiled as one. The recording side compiles tiny graphs with aot_eager (AOT autograd's graph, no code generated);
the rule's detection reads a hand-built capture."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context
from turbotrain.doctor.record.loss_capture import EagerLoss, LossCapture, compiled_graph_behind
from turbotrain.doctor.record.patcher import Patcher
from turbotrain.doctor.record.recording import Capture
from turbotrain.doctor.rules import evaluate
from turbotrain.doctor.rules.compile.compile_loss_eager import ModelAndLoss, measure
from turbotrain.doctor.sites import Site
from turbotrain.hardware import detect

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

HERE = __file__


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 5))


def _captured(run) -> LossCapture:
    """What a LossCapture keeps while ``run()`` trains, as the recorder installs it."""
    capture, patcher = LossCapture(lambda: True), Patcher()
    capture.install(patcher)
    try:
        run()
    finally:
        patcher.restore()
    return capture


def test_a_loss_on_a_compiled_output_is_caught_with_its_line_and_the_eager_ops_between():
    compiled = torch.compile(_model(), backend="aot_eager")
    x, y = torch.randn(4, 3, 8), torch.randint(0, 5, (12,))

    def step():
        loss = F.cross_entropy(compiled(x).view(-1, 5), y, label_smoothing=0.1)  # the line to name
        loss.backward()

    found = _captured(step).found
    assert found is not None and found.function == "cross_entropy"
    assert found.site is not None and found.site.file == HERE and "the line to name" in open(HERE).read().splitlines()[
        found.site.line - 1]
    assert found.input_shape == (12, 5) and found.between == ("ViewBackward0",), found
    assert torch.equal(found.rest[0], y) and found.kwargs == {"label_smoothing": 0.1}
    assert found.call is F.cross_entropy  # torch's own (restored now), not the doctor's wrapper


def test_an_nn_loss_module_is_seen_through_its_functional_call():
    compiled = torch.compile(_model(), backend="aot_eager")
    x, y = torch.randn(6, 8), torch.randn(6, 5)
    found = _captured(lambda: nn.MSELoss()(compiled(x), y).backward()).found
    assert found is not None and found.function == "mse_loss" and found.between == ()


@pytest.mark.parametrize("case", ["loss-in-graph", "eager-backend", "no-grad", "not-compiled"])
def test_no_loss_is_caught_where_the_graph_holds_it_or_there_is_no_graph(case):
    model, x, y = _model(), torch.randn(4, 8), torch.randint(0, 5, (4,))
    if case == "loss-in-graph":
        together = torch.compile(lambda x, y: F.cross_entropy(model(x), y), backend="aot_eager")
        run = lambda: together(x, y).backward()  # noqa: E731 - one line
    elif case == "eager-backend":  # no compiled graph of its own to fuse the loss into
        compiled = torch.compile(model, backend="eager")
        run = lambda: F.cross_entropy(compiled(x), y).backward()  # noqa: E731 - one line
    elif case == "no-grad":  # a validation loss
        compiled = torch.compile(model, backend="aot_eager")

        def run():
            with torch.no_grad():
                F.cross_entropy(compiled(x), y)
    else:
        run = lambda: F.cross_entropy(model(x), y).backward()  # noqa: E731 - one line
    assert _captured(run).found is None


def test_the_walk_back_stops_at_a_few_nodes():
    compiled = torch.compile(_model(), backend="aot_eager")
    out = compiled(torch.randn(2, 8))
    assert compiled_graph_behind(out) == ()
    far = out
    for _ in range(10):
        far = far * 1.0
    assert compiled_graph_behind(out.view(-1)) == ("ViewBackward0",) and compiled_graph_behind(far) is None


def _context(model: nn.Module, x: torch.Tensor, loss: EagerLoss | None) -> Context:
    capture = Capture(module=model, args=(x,), kwargs={}, batch_size=x.shape[0])
    recording = SimpleNamespace(compiled=None, driver=None, job=(), planned_loop=())  # what rules read of a Recording
    return Context(script=HERE, base=None, hw=detect("cpu"), device="cpu", breakdown=compute_breakdown([], 1),
                   measured_steps=[], capture=capture, eager_loss=loss,
                   recording=recording)  # type: ignore[arg-type]  # a stand-in Recording


def _eager_loss(y: torch.Tensor, shape=(4, 5)) -> EagerLoss:
    return EagerLoss("cross_entropy", Site(HERE, 40, "step"), shape, ("ViewBackward0",), F.cross_entropy, (y,), {})


def test_the_finding_is_at_the_loss_line_and_asks_for_its_trial():
    model, x, y = torch.compile(_model(), backend="aot_eager"), torch.randn(4, 8), torch.randint(0, 5, (4,))
    failed: list = []
    [f] = evaluate(_context(model, x, _eager_loss(y)), only=["compile-loss-eager"], failed=failed)
    assert failed == [] and (f.site.file, f.site.line) == (HERE, 40) and f.request is not None and not f.measured
    assert "F.cross_entropy" in f.message and "ViewBackward0" in f.message and f.evidence.input_shape == (4, 5)
    assert "F.cross_entropy(model(x), y)" in f.fix.pytorch and f.fix.hf_trainer
    # An eager model, or no loss caught: nothing to say.
    assert evaluate(_context(_model(), x, _eager_loss(y)), only=["compile-loss-eager"], failed=failed) == []
    assert evaluate(_context(model, x, None), only=["compile-loss-eager"], failed=failed) == []


class _Budget:
    left = 60.0

    def allows(self, cost_s: float) -> bool:
        return cost_s <= self.left


def test_both_ways_are_timed_and_compute_the_scripts_own_loss():
    model, x, y = torch.compile(_model(), backend="aot_eager"), torch.randn(4, 8), torch.randint(0, 5, (4,))
    loss = _eager_loss(y)
    # The rebuilt step is the script's loss on the same output, to the bit (eager here: nothing compiled).
    assert torch.equal(ModelAndLoss(model._orig_mod, loss)(x), F.cross_entropy(model._orig_mod(x), y))
    ctx = _context(model, x, loss)
    [f] = evaluate(ctx, only=["compile-loss-eager"], failed=[])
    measured = measure(ctx, f, _Budget())
    assert measured is not None
    result = measured.what_if
    assert "eager" in result.baseline and "as one" in result.candidate and len(result.rounds) >= 2
    assert result.baseline_ms > 0 and result.candidate_ms > 0 and "loss" in (measured.note or "")
    # A loss whose input is not the model's output reshaped is not timed.
    assert measure(_context(model, x, _eager_loss(y, shape=(3, 5))), f, _Budget()) is None


def test_a_loss_inside_a_compiled_region_is_not_recompiled_when_another_is_caught():
    """Inside a compiled region torch traces the doctor's wrapper: it must not guard the graph on what the capture
    holds, or catching an eager loss elsewhere would recompile the graph that holds its own loss."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model, head = _model(), torch.compile(_model(), backend="aot_eager")
    together = torch.compile(lambda x, y: F.cross_entropy(model(x), y), backend="aot_eager")
    x, y = torch.randn(4, 8), torch.randint(0, 5, (4,))
    graphs = []

    def steps():
        for _ in range(3):
            together(x, y).backward()
            F.cross_entropy(head(x), y).backward()  # the eager loss caught in the first step
            graphs.append(counters["stats"]["unique_graphs"])

    assert _captured(steps).found is not None
    assert graphs[1] == graphs[2] == graphs[0], graphs
