"""``anomaly-detection-on``: the calls that turn autograd's anomaly detection on are named at their line (and the
ones that turn it off are not), and the fix is timed on the model's own step; then once end to end."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from doctor_helpers import Budget, cached_report, marked_lines
from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context
from turbotrain.doctor.analysis.source import load_sources
from turbotrain.doctor.requests import OwnTrial
from turbotrain.doctor.rules import evaluate
from turbotrain.doctor.rules.step.anomaly_detection_on import AnomalyResult, measure
from turbotrain.hardware import detect

SOURCE = """import torch
import torch.autograd as ag
from lightning import Trainer
torch.autograd.set_detect_anomaly(True)
ag.set_detect_anomaly(mode=True)
torch.autograd.set_detect_anomaly(False)
with torch.autograd.detect_anomaly(check_nan=False):
    pass
trainer = Trainer(detect_anomaly=True)
quiet = Trainer(max_epochs=1)
"""


def _context(tmp_path, **fields) -> Context:
    script = tmp_path / "train.py"
    script.write_text(SOURCE)
    return Context(script=str(script), base=str(tmp_path), hw=detect("cpu"), device="cpu",
                   breakdown=compute_breakdown([], 1), measured_steps=[], sources=load_sources([str(script)]),
                   **fields)


def test_each_call_that_turns_it_on_is_named_and_asks_to_be_timed(tmp_path):
    found = evaluate(_context(tmp_path), only=["anomaly-detection-on"])
    assert sorted(f.site.line for f in found) == [4, 5, 7, 9]       # not set_detect_anomaly(False), not Trainer()
    assert all(isinstance(f.request, OwnTrial) and f.source == "static" for f in found)
    assert "Trainer(detect_anomaly=True) turns" in next(f.message for f in found if f.site.line == 9)


def test_the_fix_is_timed_on_the_captured_step_with_the_switch_on_and_off(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    capture = SimpleNamespace(module=model, args=(torch.randn(8, 16),), kwargs={})
    ctx = _context(tmp_path, capture=capture)
    [finding] = [f for f in evaluate(ctx, only=["anomaly-detection-on"]) if f.site.line == 4]
    measured = measure(ctx, finding, Budget())
    assert isinstance(measured.what_if, AnomalyResult) and len(measured.what_if.rounds) == 3
    assert measured.what_if.on_ms > 0 and measured.what_if.off_ms > 0
    assert measured.verdict.speedup > 0 and not torch.is_anomaly_enabled()  # the switch is back as it was
    assert all(p.grad is None for p in model.parameters())                 # the user's model is left clean


def test_a_script_that_left_it_on_gets_the_finding_at_its_line_timed():
    report = cached_report("anomaly_detection_left_on", what_if=True)
    [(rule, line)] = marked_lines("anomaly_detection_left_on")
    [finding] = [f for f in report.findings if f.rule == rule]
    assert finding.site.line == line and finding.measured, finding.to_dict(report.base)
    assert finding.to_dict()["what_if"]["kind"] == "anomaly_detection"
    assert not torch.is_anomaly_enabled()  # the doctor's run leaves the process as it found it
