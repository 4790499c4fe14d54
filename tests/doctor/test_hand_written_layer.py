"""`hand-written-layer`: a module that computes LayerNorm, RMSNorm, GELU or SiLU by hand is found by what it computes
(not its name), named at its ``class`` line, timed on the model's step with torch's kernel in its place, and its
forward rewritten to torch's function with the module's own parameters; one that already calls it, or computes
something else (an unbiased variance, a bias, a ReLU), is left alone."""

from __future__ import annotations

import math
import runpy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from doctor_helpers import Budget
from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context
from turbotrain.doctor.analysis.source import load_sources
from turbotrain.doctor.cst_tools import Source
from turbotrain.doctor.edits import ByHand, EditRequest
from turbotrain.doctor.requests import OwnTrial
from turbotrain.doctor.rules import evaluate
from turbotrain.doctor.rules.step.hand_written_layer import Fused, LayerResult, identify, measure, rewrite
from turbotrain.hardware import detect

pytestmark = pytest.mark.reads_no_time  # the timed test checks what was timed and restored, never which is faster


class ScaleShiftNorm(nn.Module):  # LLMs-from-scratch's LayerNorm: scale and shift, a biased variance
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps, self.scale, self.shift = eps, nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
        return self.scale * (x - mean) / torch.sqrt(var + self.eps) + self.shift


class ShiftFirstNorm(ScaleShiftNorm):  # the same, its parameters declared bias first
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.shift, self.scale, self.eps = nn.Parameter(torch.zeros(dim)), nn.Parameter(torch.ones(dim)), 1e-6


class RMS(nn.Module):  # LLaMA's RMSNorm, its epsilon not an attribute
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-8)


class TanhGELU(nn.Module):  # minGPT's NewGELU
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class ErfGELU(nn.Module):
    def forward(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class UnbiasedNorm(ScaleShiftNorm):  # torch.var's default divides by n - 1: not what F.layer_norm computes
    def forward(self, x):
        return self.scale * (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + self.eps) + self.shift


class AddBias(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return x + self.bias


class ReLU(nn.Module):
    def forward(self, x):
        return x.clamp(min=0)


class HFRMSNorm(nn.Module):  # transformers' LlamaRMSNorm: its epsilon as variance_epsilon
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


@pytest.mark.parametrize("module, fused", [
    (ScaleShiftNorm(32), Fused("layer_norm", "scale", "shift", 1e-5, "eps")),
    (ScaleShiftNorm(32).to(torch.bfloat16), Fused("layer_norm", "scale", "shift", 1e-5, "eps")),  # probed in fp32
    (HFRMSNorm(32), Fused("rms_norm", "weight", None, 1e-6, "variance_epsilon")),
    (ShiftFirstNorm(32), Fused("layer_norm", "scale", "shift", 1e-6, "eps")),
    (RMS(32), Fused("rms_norm", "weight", None, 1e-8, None)),  # 1e-8 told from 1e-12 and 1e-6 by the input scales
    (TanhGELU(), Fused("gelu", approximate="tanh")),
    (ErfGELU(), Fused("gelu")),
    (Swish(), Fused("silu")),
    (UnbiasedNorm(32), None),
    (AddBias(32), None),
    (ReLU(), None),
    (nn.Linear(4, 4), None),
])
def test_a_module_is_identified_by_what_it_computes(module, fused):
    before = [p.detach().clone() for p in module.parameters()]
    assert identify(module) == fused
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))  # probed on a copy


MODEL_FILE = '''\
import math

import torch
from torch import nn
from torch.nn import functional as F


class LayerNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps, self.scale, self.shift = eps, nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        """Normalise over the last dimension."""
        mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
        return self.scale * (x - mean) / torch.sqrt(var + self.eps) + self.shift


class GELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


class FusedNorm(nn.Module):  # nanoGPT's: torch's function already, with an optional bias
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


def build():
    return nn.Sequential(LayerNorm(16), nn.Linear(16, 16), GELU(), FusedNorm(16), LayerNorm(16), nn.Linear(16, 4))
'''


def _context(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(MODEL_FILE)
    model = runpy.run_path(str(path))["build"]()
    capture = SimpleNamespace(module=model, args=(torch.randn(8, 5, 16),), kwargs={})
    ctx = Context(script=str(path), base=str(tmp_path), hw=detect("cpu"), device="cpu",
                  breakdown=compute_breakdown([], 1), measured_steps=[], sources=load_sources([str(path)]),
                  capture=capture)
    return ctx, model


def test_each_hand_written_class_is_named_at_its_class_line_with_its_instances(tmp_path):
    ctx, _ = _context(tmp_path)
    found = {f.site.line: f for f in evaluate(ctx, only=["hand-written-layer"])}
    assert sorted(found) == [8, 19]  # not FusedNorm, which calls F.layer_norm, nor torch's own nn.Linear
    norm, gelu = found[8], found[19]
    assert norm.evidence.instances == ("0", "4") and gelu.evidence.instances == ("2",)
    assert "LayerNorm computes LayerNorm by hand (2 in the model)" in norm.message
    assert norm.fix.pytorch.startswith("return F.layer_norm(x, self.scale.shape, self.scale, self.shift, self.eps)")
    assert gelu.fix.pytorch.startswith('return F.gelu(x, approximate="tanh") in GELU.forward')
    assert isinstance(norm.request, OwnTrial) and norm.severity == "low"
    # The epsilon is each instance's own attribute, not one figure for all.
    assert norm.to_dict()["evidence"]["fused"] == {"kind": "layer_norm", "weight": "scale", "bias": "shift",
                                                  "eps_attr": "eps", "approximate": "none"}


def test_the_fix_is_timed_on_the_model_s_step_and_the_model_is_left_as_written(tmp_path):
    ctx, model = _context(tmp_path)
    norm = next(f for f in evaluate(ctx, only=["hand-written-layer"]) if f.site.line == 8)
    measured = measure(ctx, norm, Budget())
    assert isinstance(measured.what_if, LayerResult) and len(measured.what_if.rounds) == 3
    assert measured.what_if.written_ms > 0 and measured.what_if.fused_ms > 0 and measured.verdict.speedup > 0
    assert all("forward" not in m.__dict__ for m in model.modules())  # the instances' own forward is back
    assert all(p.grad is None for p in model.parameters())


def _rewrite(text: str, **params) -> str:
    req = EditRequest("hand-written-layer", "rule", "model.py", 8, "model.py:8", "label", params=params)
    return rewrite(Source(text, "model.py"), req)


NORM = {"class": "LayerNorm", "kind": "layer_norm", "weight": "scale", "bias": "shift", "eps": 1e-5,
        "eps_attr": "eps", "approximate": "none"}


def test_the_edit_returns_torch_s_function_and_computes_the_same(tmp_path):
    gelu = dict(NORM, **{"class": "GELU", "kind": "gelu", "weight": None, "bias": None, "eps": None,
                         "eps_attr": None, "approximate": "tanh"})
    new = _rewrite(_rewrite(MODEL_FILE, **NORM), **gelu)
    body = new[new.index("class LayerNorm"):new.index("class FusedNorm")]
    assert '"""Normalise over the last dimension."""\n        return F.layer_norm(x, self.scale.shape, self.scale, ' \
           "self.shift, self.eps)\n" in body
    assert '        return F.gelu(x, approximate="tanh")\n' in body and "torch.tanh" not in body
    (tmp_path / "after.py").write_text(new)
    (tmp_path / "before.py").write_text(MODEL_FILE)
    torch.manual_seed(0)
    before = runpy.run_path(str(tmp_path / "before.py"))["build"]()
    after = runpy.run_path(str(tmp_path / "after.py"))["build"]()
    after.load_state_dict(before.state_dict())  # the same parameter names: a checkpoint loads as it was
    x = torch.randn(8, 5, 16)
    torch.testing.assert_close(after(x), before(x))


def test_without_torch_functional_imported_the_edit_spells_torch_out():
    text = MODEL_FILE.replace("from torch.nn import functional as F\n", "")
    assert "return torch.nn.functional.layer_norm(x, " in _rewrite(text, **NORM)


@pytest.mark.parametrize("change, says", [
    (("def forward(self, x):\n        \"\"\"Norm", "def forward(self, x, mask=None):\n        \"\"\"Norm"),
     "other arguments than one input"),
    (("class GELU(nn.Module):", "class LayerNorm(nn.Module):"), "2 classes named LayerNorm"),
])
def test_what_it_cannot_edit_is_left_by_hand_saying_why(change, says):
    with pytest.raises(ByHand, match=says):
        _rewrite(MODEL_FILE.replace(*change), **NORM)


def test_a_model_without_hand_written_layers_gets_nothing(tmp_path):
    ctx, _ = _context(tmp_path)
    ctx.capture.module = nn.Sequential(nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))
    assert evaluate(ctx, only=["hand-written-layer"]) == []


SETTINGS_FILE = MODEL_FILE.replace("def build():", '''class Norm(nn.Module):
    def __init__(self, dim, rms):
        super().__init__()
        self.rms, self.weight = rms, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        centred = x if self.rms else x - x.mean(-1, keepdim=True)
        return self.weight * centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5)


class ClipNorm(nn.LayerNorm):  # CLIP's: torch's LayerNorm in float32 around super().forward
    def forward(self, x):
        return super().forward(x.float()).type(x.dtype)


def build():''')


@pytest.mark.parametrize("layers, named", [
    ("LayerNorm(16, eps=1e-5), LayerNorm(16, eps=1e-6)", True),  # each instance's own eps: one finding
    ("Norm(16, rms=True), Norm(16, rms=False)", False),  # RMSNorm in one, LayerNorm in the other: not one function
    ("Norm(16, rms=True), Norm(16, rms=True)", True),
    ("ClipNorm(16), ClipNorm(16)", False),  # a torch layer's subclass: torch's kernel already
])
def test_every_instance_must_compute_the_same_function(tmp_path, layers, named):
    path = tmp_path / "model.py"
    path.write_text(SETTINGS_FILE + f"\n\ndef build2():\n    return nn.Sequential({layers}, nn.Linear(16, 4))\n")
    model = runpy.run_path(str(path))["build2"]()
    capture = SimpleNamespace(module=model, args=(torch.randn(8, 5, 16),), kwargs={})
    ctx = Context(script=str(path), base=str(tmp_path), hw=detect("cpu"), device="cpu",
                  breakdown=compute_breakdown([], 1), measured_steps=[], sources=load_sources([str(path)]),
                  capture=capture)
    found = evaluate(ctx, only=["hand-written-layer"])
    assert [f.evidence.instances for f in found] == ([("0", "1")] if named else [])


def test_a_forward_set_on_an_instance_before_the_trial_is_put_back(tmp_path):
    ctx, model = _context(tmp_path)
    norm = next(f for f in evaluate(ctx, only=["hand-written-layer"]) if f.site.line == 8)
    hooked = model[0]
    wrapper = hooked.forward  # a hook library's wrapper set on the instance
    hooked.forward = wrapper
    measure(ctx, norm, Budget())
    assert hooked.__dict__["forward"] is wrapper and "forward" not in model[4].__dict__


def test_a_one_line_forward_gets_a_block_and_an_import_inside_a_function_is_not_used(tmp_path):
    text = MODEL_FILE.replace('''    def forward(self, x):
        return 0.5 * x''', '''    def forward(me, x): return 0.5 * x''').replace(
        "from torch.nn import functional as F\n", "")
    text += "\n\ndef main():\n    import torch.nn.functional as F\n"
    gelu = dict(NORM, **{"class": "GELU", "kind": "gelu", "weight": None, "bias": None, "eps": None,
                         "eps_attr": None, "approximate": "tanh"})
    new = _rewrite(text, **gelu)
    assert '    def forward(me, x):\n        return torch.nn.functional.gelu(x, approximate="tanh")\n' in new
    compile(new, "model.py", "exec")


def test_a_long_step_is_timed_in_two_rounds_of_one_step_a_side(tmp_path, monkeypatch):
    """LLMs-from-scratch's 1.8-s step asked 21 s of the default 20-s budget: a step over 0.15 s takes two rounds of
    one step each side, as the plan's trials do."""
    ctx, _ = _context(tmp_path)
    norm = next(f for f in evaluate(ctx, only=["hand-written-layer"]) if f.site.line == 8)
    monkeypatch.setattr(Context, "seconds", lambda self, phase: 0.2 if phase == "compute" else 0.0)
    measured = measure(ctx, norm, Budget())
    assert len(measured.what_if.rounds) == 2
