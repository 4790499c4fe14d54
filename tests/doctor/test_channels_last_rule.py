"""`channels-last` fires on a conv net that computes NCHW, and not on one whose conv weights are channels_last."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from turbotrain.bench.models import ResNetCNN
from turbotrain.doctor.analysis.breakdown import compute_breakdown
from turbotrain.doctor.analysis.context import Context
from turbotrain.doctor.record.forward_facts import forward_facts
from turbotrain.doctor.rules import evaluate
from turbotrain.hardware import detect
from turbotrain.speedups.model_info import inspect_model

CPU = detect("cpu")


def _fires(model: nn.Module, images: torch.Tensor) -> bool:
    facts = forward_facts(model, (images,), None)
    ctx = Context(script=None, base=None, hw=CPU, device="cpu", breakdown=compute_breakdown([], 1),
                  measured_steps=[], model=model, info=inspect_model(model), facts=facts)
    return any(f.rule == "channels-last" for f in evaluate(ctx, only=["channels-last"]))


@pytest.mark.parametrize("weights, images, fires", [
    (False, False, True),
    (True, False, False),  # airbench's model: weights channels_last, its crops NCHW; the convs compute NHWC
    (False, True, False),
], ids=["nchw", "weights-nhwc", "images-nhwc"])
def test_a_conv_net_is_told_to_go_channels_last_only_where_neither_weights_nor_images_are(weights, images, fires):
    model = ResNetCNN()
    batch = torch.randn(4, 3, 32, 32)
    if weights:
        model = model.to(memory_format=torch.channels_last)
        with torch.no_grad():  # what the rule trusts: torch's conv computes NHWC from NHWC weights, NCHW input
            assert model.stem[0](batch).is_contiguous(memory_format=torch.channels_last)
    if images:
        batch = batch.to(memory_format=torch.channels_last)
    assert _fires(model, batch) is fires
