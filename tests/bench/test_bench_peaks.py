"""MFU: the device's dense bf16 peak by name, and the utilisation it gives."""

import pytest

from turbotrain.bench.models import GPT
from turbotrain.bench.peaks import mfu, peak_bf16_flops


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA GH200 480GB", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA L40S", 362e12),
    ("NVIDIA L40", 181e12),
    ("NVIDIA L4", 121e12),
    ("NVIDIA A10", 125e12),
    ("NVIDIA A10G", None),          # not published: no MFU rather than a guess
    ("AMD EPYC 9R14", None),
])
def test_peak_by_device_name(name, peak):
    assert peak_bf16_flops(name) == peak


def test_mfu_of_gpt2_small():
    model = GPT(vocab_size=50304, seq_len=1024, dim=768, layers=12, heads=12)
    n = sum(p.numel() for p in model.parameters()) - 1024 * 768    # position embeddings do no matmul
    assert model.flops_per_token() == 6 * n + 12 * 12 * 768 * 1024
    # llm.c's figure: ~41% MFU on an H100 is about 470k tokens/s for GPT-2 small.
    assert mfu(470_000, model.flops_per_token(), 989e12) == pytest.approx(0.41, abs=0.02)
    assert mfu(470_000, model.flops_per_token(), None) is None
