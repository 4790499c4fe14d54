"""How much of a step is per-op dispatch and interpreter time rather than the kernels' own work.

Two measurements on the user's own objects, after the run:

* forward + backward: the ATen ops one step of a copy of the captured model runs (counted, not
  timed), each at the cost of an op of a step whose kernels do nothing (a tiny MLP at batch 1 on
  this machine). A bigger kernel does not move it; timing the step at two batch sizes did, since a
  doubled GEMM is also a more efficient one.
* optimizer: its time minus the memory traffic its update needs (parameters, gradients and state
  read and written once) at this machine's copy bandwidth. A few tiny tensors are all overhead;
  a large model is all traffic.

When the model was not captured, an estimate from the op count of the profiled steps times the
cost of a do-nothing op stands in.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from ...measure import copy_for_trial

__all__ = ["dispatch_floor", "bandwidth", "count_ops", "counted_overhead", "optimizer_overhead_s"]


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


class _OpCounter(TorchDispatchMode):
    """Counts the ATen ops that reach the kernels (forward and backward), whatever their size."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> int:
    """ATen ops one call of ``fn`` runs (autograd's backward ops included)."""
    with _OpCounter() as counter:
        fn()
    return counter.ops


def _tiny_step() -> Callable[[], None]:
    """A training step whose kernels do next to nothing (a 4-wide MLP at batch 1): Python, module calls, dispatch
    and autograd bookkeeping, in the mix a real step has."""
    from .replay import surrogate_step

    tiny = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    batch: tuple[tuple[torch.Tensor, ...], dict[str, Any]] = ((torch.randn(1, 4),), {})

    def step() -> None:
        surrogate_step(tiny, batch).backward()

    return step


# Tiny steps timed per round: their mean is one op floor reading (a single one is a few hundred microseconds).
TINY_STEPS = 20


def counted_overhead(capture: Any, budget_s: float = 2.0) -> dict[str, float] | None:
    """Share of one forward+backward of the captured model that is per-op overhead: its ATen op count times the
    cost of an op of :func:`_tiny_step`, over the same step timed without the doctor's hooks (which would otherwise
    count as the model's own work). Kernel size cannot move the count, as it moved a timing at two batch sizes.

    The tiny step and the model's are timed alternately, in the same rounds: one process's op cost moved 2x with
    what ran in it before (a first measurement in a fresh process, or during the doctor's analysis, read 5-8 us an
    op where a later one read 3.3), and only a ratio of the two taken together holds still."""
    from .replay import surrogate_step, time_once

    model = copy_for_trial(capture.module)
    cuda = any(p.is_cuda for p in model.parameters())

    def step() -> None:
        surrogate_step(model, (capture.args, capture.kwargs)).backward()

    tiny = _tiny_step()
    try:
        ops, tiny_ops = count_ops(step), count_ops(tiny)
        for _ in range(20):
            tiny()
        timed: list[float] = []
        floors: list[float] = []
        while len(timed) < 5 and (len(timed) < 2 or sum(timed) * 2 < budget_s):
            timed.append(time_once(step, cuda))
            floors.append(sum(time_once(tiny, False) for _ in range(TINY_STEPS)) / TINY_STEPS / tiny_ops)
    except Exception:  # noqa: BLE001 - a model that cannot run twice: fall back to the profiler's estimate
        return None
    finally:
        model.zero_grad(set_to_none=True)
    overhead, fwd_bwd = ops * min(floors), min(timed)
    return {
        "ops_per_step": float(ops),
        "op_floor_us": overhead / ops * 1e6 if ops else 0.0,
        "overhead_ms": overhead * 1e3,
        "fwd_bwd_ms": fwd_bwd * 1e3,
        "share": min(0.95, overhead / fwd_bwd) if fwd_bwd > 0 else 0.0,
    }
