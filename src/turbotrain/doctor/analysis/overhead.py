"""How much of a step is per-op dispatch and interpreter time rather than the kernels' own work.

Two measurements on the user's own objects, after the run:

* forward + backward: timed on a copy of the captured model at the captured batch ``B`` and at
  ``2B``. Work that scales with the batch doubles; what does not (launching ops, Python in the
  modules, autograd bookkeeping) stays. The fixed part ``2*t(B) - t(2B)`` over ``t(B)`` is the
  share of compute that is overhead.
* optimizer: its time minus the memory traffic its update needs (parameters, gradients and state
  read and written once) at this machine's copy bandwidth. A few tiny tensors are all overhead;
  a large model is all traffic.

When the model was not captured, an estimate from the op count of the profiled steps times the
cost of a do-nothing op stands in.
"""

from __future__ import annotations

import copy
import functools
import time
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["dispatch_floor", "bandwidth", "fixed_cost_share", "optimizer_overhead_s"]


@functools.lru_cache(maxsize=1)
def dispatch_floor() -> tuple[float, float]:
    """(seconds per do-nothing op with autograd, seconds per do-nothing module call) on this machine."""
    x = torch.ones(1, requires_grad=True)
    ident = nn.Identity()

    def per_call(fn, n: int = 300) -> float:
        started = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - started) / n

    per_call(lambda: x + x, 50)
    return min(per_call(lambda: x + x) for _ in range(5)), min(per_call(lambda: ident(x)) for _ in range(5))


@functools.lru_cache(maxsize=4)
def bandwidth(device: str = "cpu") -> float:
    """Bytes per second of a large copy on ``device`` (read + write), best of a few."""
    from .replay import time_once

    n = 8 * 2**20  # 32 MiB of float32: past the CPU's caches
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    best = min(time_once(lambda: dst.copy_(src), device != "cpu") for _ in range(5))
    return 2 * n * 4 / best


def optimizer_traffic_bytes(optimizers: list[Any]) -> int:
    """Bytes one update reads and writes: each parameter (r+w), its gradient (r), its state tensors (r+w)."""
    total = 0
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                size = p.numel() * p.element_size()
                state = [v for v in opt.state.get(p, {}).values() if torch.is_tensor(v) and v.numel() == p.numel()]
                total += size * (3 + 2 * len(state))
    return total


def optimizer_overhead_s(optimizers: list[Any], optimizer_s: float, device: str) -> float:
    """Seconds of the optimizer's time per step beyond its memory traffic."""
    if optimizer_s <= 0 or not optimizers:
        return 0.0
    work = optimizer_traffic_bytes(optimizers) / bandwidth(device if device == "cpu" else "cuda")
    return max(0.0, optimizer_s - work)


def fixed_cost_share(capture: Any, budget_s: float = 3.0) -> dict[str, float] | None:
    """Share of forward+backward time that does not grow with the batch, measured on a model copy."""
    from .replay import fastest_pair, repeat_batch, surrogate_step, time_once

    model = copy.deepcopy(capture.module)
    cuda = any(p.is_cuda for p in model.parameters())

    def step(batch) -> Callable[[], None]:
        return lambda: surrogate_step(model, batch).backward()

    single, double = step((capture.args, capture.kwargs)), step(repeat_batch(capture, 2))
    try:
        if time_once(single, cuda) * 18 > budget_s:
            return None  # too slow to measure in the time allowed (and a big step is not overhead-bound)
        time_once(double, cuda)
        t1, t2 = fastest_pair(single, double, cuda, 5)  # interleaved: interference hits both sizes alike
    except Exception:  # noqa: BLE001 - a model that cannot run twice the batch: fall back to the estimate
        return None
    finally:
        model.zero_grad(set_to_none=True)
    fixed = min(max(2 * t1 - t2, 0.0), t1)
    return {"fwd_bwd_ms": t1 * 1e3, "fwd_bwd_2x_ms": t2 * 1e3, "fixed_share": fixed / t1 if t1 > 0 else 0.0}
