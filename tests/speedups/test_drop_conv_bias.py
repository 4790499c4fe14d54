import copy

import torch
from tiny import ConvBNNet

import turbotrain as tt
from turbotrain.speedups.drop_conv_bias import drop_conv_bias_before_bn


def test_only_conv_directly_feeding_bn_loses_its_bias():
    model = ConvBNNet()
    assert drop_conv_bias_before_bn(model) == ["conv1"]
    assert model.conv1.bias is None and model.conv2.bias is not None


def test_rewrite_is_exact_in_training_and_in_evaluation():
    torch.manual_seed(0)
    before = ConvBNNet()
    with torch.no_grad():
        before.conv1.bias.uniform_(-2, 2)  # a bias large enough to matter if it were not cancelled
    after = copy.deepcopy(before)
    drop_conv_bias_before_bn(after)
    x = torch.randn(4, 3, 8, 8)
    torch.testing.assert_close(after(x), before(x), rtol=1e-4, atol=1e-5)  # train mode: batch statistics
    torch.testing.assert_close(after.bn1.running_mean, before.bn1.running_mean - before.conv1.bias.detach())
    before.eval(), after.eval()
    torch.testing.assert_close(after(x), before(x), rtol=1e-4, atol=1e-5)  # eval mode: running statistics


def test_removed_parameters_leave_the_optimizer():
    model = ConvBNNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = sum(len(g["params"]) for g in opt.param_groups)
    rt = tt.prepare(model, opt, tt.Plan(device="cpu", drop_conv_bias=True))
    assert "drop_conv_bias" in rt.applied
    assert sum(len(g["params"]) for g in opt.param_groups) == n - 1
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in model.parameters()}


def test_untraceable_model_is_left_alone():
    class Dynamic(ConvBNNet):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
                return super().forward(x)
            return super().forward(-x)

    model = Dynamic()
    assert drop_conv_bias_before_bn(model) == []
    assert model.conv1.bias is not None
