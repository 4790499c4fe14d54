import logging

import pytest
import torch
from torch import nn

import turbotrain as tt
from turbotrain.speedups.precision import autocast_dtype


def _matmul_dtype(rt, x):
    seen = {}
    lin = rt.module[0]
    handle = lin.register_forward_hook(lambda m, i, o: seen.update(dtype=o.dtype))  # returns None: output kept
    with rt.autocast():
        rt.model(x)
    handle.remove()
    return seen["dtype"]


def test_bf16_mixed_runs_linear_layers_in_bf16_keeps_fp32_weights():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    rt = tt.prepare(model, None, tt.Plan(device="cpu", precision="bf16-mixed"))
    assert rt.autocast_dtype is torch.bfloat16 and rt.scaler is None
    assert _matmul_dtype(rt, torch.randn(4, 8)) is torch.bfloat16
    assert all(p.dtype is torch.float32 for p in model.parameters())


def test_fp32_has_no_autocast():
    rt = tt.prepare(nn.Sequential(nn.Linear(8, 8)), None, tt.Plan(device="cpu"))
    assert _matmul_dtype(rt, torch.randn(4, 8)) is torch.float32


def test_bf16_true_casts_weights_and_floating_inputs_only():
    model = nn.Sequential(nn.Linear(8, 8))
    rt = tt.prepare(model, None, tt.Plan(device="cpu", precision="bf16-true"))
    assert all(p.dtype is torch.bfloat16 for p in model.parameters())
    x, y = rt.to_device((torch.randn(2, 8), torch.tensor([1, 2])))
    assert x.dtype is torch.bfloat16 and y.dtype is torch.int64


def test_fp16_mixed_on_cpu_is_skipped_with_one_line(caplog):
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    caplog.set_level(logging.WARNING, logger="turbotrain")
    rt = tt.prepare(nn.Linear(2, 2), None, tt.Plan(device="cpu", precision="fp16-mixed"))
    assert rt.scaler is None and rt.autocast_dtype is None
    assert [name for name, _ in rt.skipped] == ["precision"]
    lines = [r.getMessage() for r in caplog.records if "precision skipped" in r.getMessage()]
    assert len(lines) == 1 and "bf16-mixed" in lines[0]


def test_autocast_dtype_table():
    assert autocast_dtype("bf16-mixed") is torch.bfloat16
    assert autocast_dtype("fp16-mixed") is torch.float16
    assert autocast_dtype("fp32") is None and autocast_dtype("bf16-true") is None


@pytest.mark.gpu
def test_fp16_mixed_uses_grad_scaler_on_cuda():
    rt = tt.prepare(nn.Linear(8, 8), torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1),
                    tt.Plan(device="cuda", precision="fp16-mixed"))
    assert rt.scaler is not None and rt.autocast_dtype is torch.float16
