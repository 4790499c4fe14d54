"""Re-running the captured model: the surrogate training step, one timed call, the faster of two, a batch
made k times larger. Analysis (python_overhead) and the what-ifs both time the model this way."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

from ...data.transfer import resize_batch, tensors_in
from ..record.recording import Capture

__all__ = ["surrogate_step", "time_once", "fastest_pair", "repeat_batch"]


def surrogate_step(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """Forward the captured ``(args, kwargs)``; the loss is the mean square of the differentiable outputs."""
    args, kwargs = batch
    out = model(*args, **kwargs)
    parts = [t.float().pow(2).mean() for t in tensors_in(out) if t.is_floating_point() and t.requires_grad]
    if not parts:
        raise ValueError("the model's output holds no differentiable tensor to build a loss from")
    return torch.stack(parts).sum() if len(parts) > 1 else parts[0]


def time_once(fn: Callable[[], object], cuda: bool) -> float:
    """Seconds for one call of ``fn``, the device's queued work included."""
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - started


def fastest_pair(a: Callable[[], object], b: Callable[[], object], cuda: bool, repeats: int) -> tuple[float, float]:
    """Seconds per call of ``a`` and ``b``, timed alternately, the fastest of ``repeats`` each (another
    process only ever adds time, and alternating spreads it over both)."""
    t_a = t_b = float("inf")
    for _ in range(repeats):
        t_a = min(t_a, time_once(a, cuda))
        t_b = min(t_b, time_once(b, cuda))
    return t_a, t_b


def repeat_batch(capture: Capture, k: int) -> tuple[Any, ...]:
    """The captured (args, kwargs) with every batch-sized tensor repeated ``k`` times along dim 0; an unbatched
    sample's tensors become ``k`` copies stacked on a new dim 0 (a batch of ``k`` such samples)."""
    if capture.unbatched:
        return tree_map(
            lambda t: torch.stack([t] * k) if isinstance(t, torch.Tensor) else t, (capture.args, capture.kwargs)
        )
    n = capture.batch_size
    return resize_batch((capture.args, capture.kwargs), n * k, rows=n, dim=capture.batch_dim)
