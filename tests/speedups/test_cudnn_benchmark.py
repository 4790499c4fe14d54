import pytest
import torch
from torch import nn

import turbotrain as tt
from turbotrain.speedups.cudnn_benchmark import set_cudnn_benchmark


def test_pure_function_sets_the_flag():
    set_cudnn_benchmark(True)
    assert torch.backends.cudnn.benchmark is True
    set_cudnn_benchmark(False)
    assert torch.backends.cudnn.benchmark is False


def test_skipped_on_cpu_without_touching_the_flag():
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    rt = tt.prepare(nn.Linear(2, 2), None, tt.Plan(device="cpu", cudnn_benchmark=True))
    assert rt.skipped == [("cudnn_benchmark", "cuDNN is a CUDA library and this run is on the CPU")]
    assert torch.backends.cudnn.benchmark is False


@pytest.mark.gpu
def test_sets_flag_on_cuda():
    tt.prepare(nn.Conv2d(3, 3, 3), None, tt.Plan(device="cuda", cudnn_benchmark=True))
    assert torch.backends.cudnn.benchmark is True
