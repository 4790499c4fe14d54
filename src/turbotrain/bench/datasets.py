"""The reference workloads' data, made in place (nothing downloaded): text, images, vectors, tokens."""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

__all__ = ["stdlib_bytes", "text_dataset", "image_dataset", "random_token_dataset", "vector_dataset"]


@functools.lru_cache(maxsize=4)
def stdlib_bytes(max_bytes: int = 4_000_000) -> torch.Tensor:
    """Up to ``max_bytes`` of the standard library's .py sources, in a fixed order, as uint8."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        size += len(data)
        if size >= max_bytes:
            break
    if size < 10_000:
        raise RuntimeError(
            f"found only {size} bytes of Python sources under {root}; the GPT workload needs the "
            "standard library's source files"
        )
    return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8)


def text_dataset(samples: int, seq_len: int, seed: int = 0) -> TensorDataset:
    """``samples`` windows of ``seq_len`` bytes (inputs) and the bytes that follow them (targets)."""
    data = stdlib_bytes()
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, data.numel() - seq_len - 1, (samples,), generator=g)
    windows = torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()]).long()
    return TensorDataset(windows[:, :-1].contiguous(), windows[:, 1:].contiguous())


def image_dataset(samples: int, size: int = 32, classes: int = 10, seed: int = 0) -> TensorDataset:
    """Class-conditional synthetic images: a smooth per-class template plus noise."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(classes, 3, 4, 4, generator=g)
    templates = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    labels = torch.randint(0, classes, (samples,), generator=g)
    images = templates[labels] + 1.5 * torch.randn(samples, 3, size, size, generator=g)
    return TensorDataset(images, labels)


def random_token_dataset(samples: int, seq_len: int, vocab_size: int, seed: int = 0) -> TensorDataset:
    """Uniformly random tokens (throughput only: the loss cannot fall below ln(vocab_size))."""
    g = torch.Generator().manual_seed(seed)
    windows = torch.randint(0, vocab_size, (samples, seq_len + 1), generator=g)
    return TensorDataset(windows[:, :-1].contiguous(), windows[:, 1:].contiguous())


def vector_dataset(samples: int, inputs: int = 32, classes: int = 10, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, inputs, generator=g)
    y = x[:, :classes].argmax(1)
    return TensorDataset(x, y)
