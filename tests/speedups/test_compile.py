import pytest
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


def test_the_loss_is_compiled_beside_the_model_only_on_a_gpu_and_once():
    rt = tt.prepare(nn.Linear(2, 2), None, tt.Plan(device="cpu", compile=True))
    loss = nn.functional.mse_loss
    assert rt.wrap_loss(loss) is loss and rt.wrap_loss(None) is None  # a CPU loss's compile costs more than it saves
    made = []
    rt.loss_wrapper = lambda fn: made.append(fn) or (lambda *a: fn(*a) * 1)
    assert rt.wrap_loss(loss) is rt.wrap_loss(loss) and made == [loss]  # per-step callers reuse one wrapper


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_compiled_loss_matches_eager_and_the_trainer_runs_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 50))
    plan = tt.Plan(device="cuda", compile=True)
    rt = tt.prepare(model, None, plan)
    compiled = rt.wrap_loss(nn.functional.cross_entropy)
    assert compiled is not nn.functional.cross_entropy and hasattr(compiled, "_torchdynamo_orig_callable")
    logits, y = torch.randn(32, 50, device="cuda"), torch.randint(0, 50, (32,), device="cuda")
    torch.testing.assert_close(compiled(logits, y), nn.functional.cross_entropy(logits, y))
    trainer = tt.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.functional.cross_entropy,
                         plan=plan, max_steps=3, progress=False)
    assert hasattr(trainer._run_loss, "_torchdynamo_orig_callable")  # what torch.compile returns
    trainer.fit([(torch.randn(8, 16), torch.randint(0, 50, (8,)))] * 3)
    assert trainer.state.step == 3


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
