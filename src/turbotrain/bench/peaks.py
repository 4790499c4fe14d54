"""Model FLOPs utilisation: achieved training FLOP/s against the device's dense bf16 peak.

MFU = tokens/s x FLOPs per token / peak, with FLOPs per token = 6N + 12·L·H·Q·T (PaLM,
appendix B; ``GPT.flops_per_token``). The peak is the vendor's dense (no 2:4 sparsity)
bf16 tensor-core figure, whatever precision the row ran in, so rows compare on one scale.
"""

from __future__ import annotations

__all__ = ["BF16_DENSE_PEAKS", "peak_bf16_flops", "mfu"]

# (substring of torch.cuda.get_device_name(), dense bf16 FLOP/s) from NVIDIA's datasheets.
# The first match wins, so the more specific names come before the names they contain; None
# marks a device whose peak is not published (no MFU rather than a guess).
BF16_DENSE_PEAKS: tuple[tuple[str, float | None], ...] = (
    ("GH200", 989e12),
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM (HBM3), e.g. "NVIDIA H100 80GB HBM3"
    ("H800", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10G", None),
    ("A10", 125e12),
    ("RTX 4090", 165e12),  # with fp32 accumulation
    ("RTX 3090", 71e12),
)


def peak_bf16_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a device by its name, or None when it is not in the table."""
    for key, flops in BF16_DENSE_PEAKS:
        if key.lower() in device_name.lower():
            return flops
    return None


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None without a known peak."""
    if not peak_flops or tokens_per_s <= 0:
        return None
    return tokens_per_s * flops_per_token / peak_flops
