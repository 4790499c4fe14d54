import pytest
import torch
from torch import nn

import turbotrain as tt
from turbotrain.speedups.tf32 import set_tf32


def test_pure_function_sets_matmul_and_cudnn_flags():
    set_tf32(True)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    set_tf32(False)
    assert not torch.backends.cuda.matmul.allow_tf32


def test_skipped_without_ampere():
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    rt = tt.prepare(nn.Linear(2, 2), None, tt.Plan(device="cpu", tf32=True))
    assert [n for n, _ in rt.skipped] == ["tf32"]
    assert not torch.backends.cuda.matmul.allow_tf32


@pytest.mark.gpu
def test_enabled_on_ampere_or_newer():
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("needs Ampere")
    tt.prepare(nn.Linear(2, 2), None, tt.Plan(device="cuda", tf32=True))
    assert torch.backends.cuda.matmul.allow_tf32
