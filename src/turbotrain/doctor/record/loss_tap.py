"""The losses of a run, as the scalars ``torch.autograd.backward`` is called on: kept as tensors and read after
the run, so no step gains a host sync. ``doctor --verify`` compares them between the original and the patch."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["LossTap"]


class LossTap:
    """Keeps every scalar that ``torch.autograd.backward`` is called on (``loss.backward()`` goes through it)."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []
        self._original: Any = None

    def __enter__(self) -> "LossTap":
        self._original = original = torch.autograd.backward
        kept = self.losses

        def backward(tensors, *args, **kwargs):
            if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
                kept.append(tensors.detach().clone())
            return original(tensors, *args, **kwargs)

        torch.autograd.backward = backward
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.autograd.backward = self._original

    def values(self) -> list[float]:
        return [float(t.float().item()) for t in self.losses]
