"""One "conv net" test for the whole project: Plan.fast, the tuner and the doctor ask the same predicate."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from torch import nn

import turbotrain as tt
from turbotrain.bench.models import ResNetCNN
from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context
from turbotrain.doctor.record.measurements import ForwardFacts
from turbotrain.doctor.rules import evaluate
from turbotrain.hardware import detect
from turbotrain.speedups.model_info import CONV_NET, CONV_NET_SHARE, inspect_model
from turbotrain.tuning.candidates import build_candidates

SRC = Path(tt.__file__).parent
CPU = detect("cpu")
CUDA = dataclasses.replace(CPU, device_type="cuda", device_name="fake A100", capability=(8, 0), bf16=True,
                           fp16=True, tf32=True, cudnn=True)


def vit_stem() -> nn.Module:
    """A patch-embedding Conv2d in front of linear layers: has a Conv2d, is not a conv net."""
    return nn.Sequential(nn.Conv2d(3, 64, 4, stride=4), nn.Flatten(2), nn.Linear(64, 512), nn.Linear(512, 512))


def _doctor_fires(model: nn.Module, rule: str) -> bool:
    ctx = Context(script=None, base=None, hw=CUDA, device="cuda", breakdown=compute_breakdown([], 1),
                  measured_steps=[], model=model, info=inspect_model(model),
                  facts=ForwardFacts(input_shapes=((8, 3, 32, 32),)))
    return any(f.rule == rule for f in evaluate(ctx, only=[rule]))


@pytest.mark.parametrize("model, conv_net", [(ResNetCNN(), True), (vit_stem(), False)], ids=["resnet", "vit-stem"])
def test_plan_fast_the_tuner_and_the_doctor_agree_on_what_a_conv_net_is(model, conv_net):
    info = inspect_model(model)
    assert info.n_conv2d > 0 and CONV_NET(info) is conv_net
    fast = tt.Plan.fast(model, device="cpu")
    cands = build_candidates(CUDA, info, tt.Plan())
    timed = {s.field for s in cands.timed}
    for field, rule in (("channels_last", "channels-last"), ("cudnn_benchmark", "cudnn-benchmark-off")):
        assert (field in timed) is conv_net, field
        assert _doctor_fires(model, rule) is conv_net, rule
    assert fast.channels_last is conv_net
    if not conv_net:
        assert dict(cands.left_out)["channels_last"] == CONV_NET.unmet


def test_the_share_threshold_decides():
    def net(head: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 16, 3), nn.Flatten(), nn.Linear(16, head), nn.Linear(head, 10))

    shares = {head: inspect_model(net(head)).conv_param_share for head in (4, 400)}
    assert shares[4] >= CONV_NET_SHARE > shares[400]
    assert inspect_model(net(4)).is_conv_net and not inspect_model(net(400)).is_conv_net


def test_no_module_outside_model_info_reads_the_conv_counts():
    """A second "conv net" test would start by reading these counts: only model_info.py may."""
    readers = [str(path.relative_to(SRC)) for path in SRC.rglob("*.py") if path.name != "model_info.py"
               and re.search(r"\.(n_conv2d|conv_param_share)\b", path.read_text())]
    assert readers == []
