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
