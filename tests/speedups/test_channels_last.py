import torch
from torch import nn

import turbotrain as tt
from turbotrain.speedups.channels_last import to_channels_last


def test_conv_weights_and_image_inputs_become_nhwc():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    params = [id(p) for p in model.parameters()]
    rt = tt.prepare(model, None, tt.Plan(device="cpu", channels_last=True))
    weight = model[0].weight
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    assert [id(p) for p in model.parameters()] == params  # optimizer references stay valid
    x, y = rt.to_device((torch.randn(2, 3, 5, 5), torch.randn(2, 3)))
    assert x.is_contiguous(memory_format=torch.channels_last) and y.is_contiguous()
    assert rt.model(x).is_contiguous(memory_format=torch.channels_last)


def test_pure_function_leaves_non_4d_parameters_alone():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Flatten(), nn.Linear(4, 2))
    to_channels_last(model)
    assert model[2].weight.is_contiguous()
