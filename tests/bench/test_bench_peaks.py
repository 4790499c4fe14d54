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


def test_flops_per_token_is_6n_plus_attention():
    model = GPT(vocab_size=300, seq_len=64, dim=32, layers=3, heads=4)
    n = sum(p.numel() for p in model.parameters()) - 64 * 32      # position embeddings do no matmul
    assert model.flops_per_token() == 6 * n + 12 * 3 * 32 * 64


def test_mfu_against_the_llm_c_anchor():
    # GPT-2 small (124.5M parameters, 50304 vocabulary, 1024 tokens): 6N + 12LHQT = 855.4 MFLOP per token,
    # so llm.c's ~41% MFU on an H100 (989 TFLOP/s dense bf16) is about 470k tokens/s.
    assert mfu(470_000, 855_383_040, peak_bf16_flops("NVIDIA H100 80GB HBM3")) == pytest.approx(0.41, abs=0.01)
    assert mfu(470_000, 855_383_040, None) is None
    assert mfu(0.0, 855_383_040, 989e12) is None


def _result(scale):
    from turbotrain.bench.runner import BenchResult, Row, WorkloadResult

    def row(label, units, mfu_value):
        return Row(label, "alone", "resident", None, {}, units_per_s=units, units_per_s_runs=[units], mfu=mfu_value)

    gpt = WorkloadResult("gpt", "tokens", scale, 16, 124_000_000, 8.5e8,
                         [row("naive", 100_000.0, 0.09), row("fast", 400_000.0, 0.35)])
    cnn = WorkloadResult("cnn", "images", scale, 128, 25_557_032, None, [row("naive", 900.0, None),
                                                                          row("fast", 3000.0, None)])
    return BenchResult({"device": "NVIDIA H100 80GB HBM3"}, {}, [], [gpt, cnn])


def test_gpu_results_are_held_against_the_published_anchors():
    from turbotrain.bench.anchors import compare_to_anchors

    lines = compare_to_anchors(_result("gpu"))
    assert any("35.0% MFU" in line and "0.85x the 41% MFU of llm.c" in line for line in lines)
    assert any("3,000 images/s" in line and "1.21x the 2,470 images/s" in line for line in lines)
    assert compare_to_anchors(_result("cpu")) == []     # a CPU-scale run is not comparable
