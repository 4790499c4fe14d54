"""Reference workloads: a model, its data (made in place, nothing downloaded) and how to train it.

* ``gpt``: a small decoder-only transformer on byte-level text taken from the Python standard
  library's own source files, so the loss really falls. Unit: tokens.
  At ``scale="gpu"`` it is GPT-2 small: 124M parameters with a 50304-token vocabulary,
  1024-token sequences (byte tokens by default, so the loss still falls; ``tokens="random"``
  for uniformly random tokens over the whole vocabulary).
* ``cnn``: a ResNet-style net on synthetic class-conditional images (each class a fixed
  smooth pattern plus noise), 32x32 on CPU; at ``scale="gpu"`` a Bottleneck ResNet-50 on
  224x224 images and 1000 classes. Unit: images.
* ``mlp``: a tiny MLP on in-memory data, where the framework's own per-step cost dominates.
* ``data``: many small image files behind a real nginx that is slow to answer, and a small conv
  net (``bench/data_workload.py``). Unit: samples, per epoch.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch.nn.functional as F

from .data_workload import files_workload
from .datasets import image_dataset, random_token_dataset, stdlib_bytes, text_dataset, vector_dataset
from .models import GPT, ResNet50, ResNetCNN, TinyMLP, lm_loss
from .workload import Workload

# Workload and the data sets were defined here before they had modules of their own: still importable from here.
__all__ = [
    "Workload",
    "get_workload",
    "WORKLOADS",
    "stdlib_bytes",
    "text_dataset",
    "image_dataset",
    "random_token_dataset",
]


def _gpt(scale: str, tokens: str = "bytes", vocab_size: int | None = None) -> Workload:
    if scale == "gpu":  # GPT-2 small: 12 layers, 768 wide, 1024 tokens, GPT-2's vocabulary padded to 50304
        cfg = dict(seq_len=1024, dim=768, layers=12, heads=12, vocab_size=vocab_size or 50304)
        # 32 sequences: the naive fp32 step's ~40 GiB fits an 80 GB card, and a compiled bf16 step is long enough
        # that the host's launches hide behind the device's work (at 16 they did not: host 38 ms, GPU 35 ms).
        batch, samples = 32, 2048
    else:
        cfg = dict(seq_len=128, dim=128, layers=2, heads=4, vocab_size=vocab_size or 256)
        batch, samples = 16, 4096
    if tokens == "bytes":
        if cfg["vocab_size"] < 256:
            raise ValueError(f"byte tokens need vocab_size >= 256, got {cfg['vocab_size']}")
        make_dataset = lambda seed: text_dataset(samples, cfg["seq_len"], seed)  # noqa: E731 - one factory per branch
    elif tokens == "random":
        make_dataset = lambda seed: random_token_dataset(samples, cfg["seq_len"], cfg["vocab_size"], seed)  # noqa: E731 - one factory per branch
    else:
        raise ValueError(f"tokens must be 'bytes' or 'random', got {tokens!r}")
    return Workload("gpt", "tokens", cfg["seq_len"], batch, lambda: GPT(**cfg), lm_loss, make_dataset, lr=1e-3)


def _cnn(scale: str) -> Workload:
    if scale == "gpu":  # ResNet-50 on 224x224, 1000 classes; batch 256 (NVIDIA's AMP setting) needs ~22 GiB in fp32
        return Workload(
            "cnn",
            "images",
            1,
            256,
            ResNet50,
            F.cross_entropy,
            lambda seed: image_dataset(1024, 224, classes=1000, seed=seed),
            lr=2e-3,
        )
    return Workload(
        "cnn",
        "images",
        1,
        64,
        lambda: ResNetCNN(width=32, blocks=(1, 1, 1)),
        F.cross_entropy,
        lambda seed: image_dataset(4096, 32, seed=seed),
        lr=2e-3,
    )


def _mlp(scale: str) -> Workload:
    return Workload(
        "mlp", "samples", 1, 32, TinyMLP, F.cross_entropy, lambda seed: vector_dataset(32 * 200, seed=seed), lr=1e-2
    )


def _data(scale: str, quick: bool = False, files: int | None = None, latency_ms: float | None = None) -> Workload:
    return files_workload(scale, quick=quick, files=files, latency_ms=latency_ms)


WORKLOADS: dict[str, Callable[[str], Workload]] = {"gpt": _gpt, "cnn": _cnn, "mlp": _mlp, "data": _data}


def get_workload(name: str, scale: str = "cpu", **options) -> Workload:
    """A reference workload by name; ``scale`` is 'cpu' (seconds per run) or 'gpu' (GPT-2 small, ResNet-50).

    ``options`` go to the workload: ``gpt`` takes ``tokens='bytes'|'random'`` and ``vocab_size``;
    ``data`` takes ``quick``, ``files`` and ``latency_ms``.
    """
    try:
        factory = WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}") from None
    if scale not in ("cpu", "gpu"):
        raise ValueError(f"scale must be 'cpu' or 'gpu', got {scale!r}")
    try:
        inspect.signature(factory).bind(scale, **options)
    except TypeError:
        raise TypeError(f"workload {name!r} does not take option(s) {sorted(options)}") from None
    return factory(scale, **options)
