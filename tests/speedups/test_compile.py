import torch
from torch import nn

import turbotrain as tt


def test_compile_wraps_forward_shares_parameters_and_matches_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 2))
    rt = tt.prepare(model, None, tt.Plan(device="cpu", compile=True))
    assert isinstance(rt.model, torch._dynamo.eval_frame.OptimizedModule)
    assert rt.module is model
    assert {id(p) for p in rt.model.parameters()} == {id(p) for p in model.parameters()}
    x = torch.randn(3, 4)
    torch.testing.assert_close(rt.model(x), model(x))


def test_compile_mode_is_passed_through():
    calls = []
    original = torch.compile

    def spy(model, **kwargs):
        calls.append(kwargs)
        return model

    torch.compile = spy
    try:
        tt.prepare(nn.Linear(2, 2), None, tt.Plan(device="cpu", compile="max-autotune"))
    finally:
        torch.compile = original
    assert calls == [{"mode": "max-autotune"}]



def test_on_cpu_the_rules_compile_a_conv_net_even_when_its_linear_head_holds_most_weights():
    from turbotrain.speedups.model_info import inspect_model

    def net(head: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 16, 3), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(16, head), nn.Linear(head, 10))

    convs_40pct, convs_20pct = net(150), net(400)
    assert 0.3 <= inspect_model(convs_40pct).conv_param_share < 0.5
    assert inspect_model(convs_20pct).conv_param_share < 0.3
    assert tt.Plan.fast(convs_40pct, device="cpu").compile is True
    assert tt.Plan.fast(convs_20pct, device="cpu").compile is False
