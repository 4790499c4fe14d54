"""The batch-size finder: the largest batch that fits, a multiple of 8, with a safety margin.

Sizes are tried by doubling from the loader's batch size (or halving when it does not fit),
then bisected between the last size that fitted and the first that did not. Each size is
one short ``run_trial`` on the user's model, with the sample batch tiled to that size:

* on a GPU a size fits when it does not run out of memory and its peak allocation stays
  under the device's memory less the margin; an out-of-memory error is caught inside the
  trial, and everything it allocated is freed before the next size (the finder checks that
  allocated memory is back where it started);
* on the CPU a size fits when the process's peak resident memory stays under a budget
  (default: what is resident now plus what the system reports available), less the margin.

Call it with the plan training will use: compile and precision change how much memory a
step needs (``tt.tune`` runs it with the chosen plan, compile included).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..data.transfer import batch_size_of, resize_batch
from ..hardware import resolve_device
from ..measure import Trial, run_trial
from ..plan import Plan
from ..speedups.batch_size import round_to_multiple
from .memory import host_memory_budget, release_host_memory

__all__ = ["BatchSizeResult", "find_batch_size", "split_effective_batch"]

MARGIN = 0.1
"""Share of the memory limit kept free: allocator fragmentation, a longer sequence, the evaluation pass."""


@dataclass
class BatchSizeResult:
    batch_size: int  # the micro-batch per step
    grad_accum_steps: int  # >1 only when keeping an effective batch that does not fit at once
    limit_bytes: int  # the memory the sizes were held to (before the margin)
    margin: float
    peak_memory_bytes: int | None  # measured at ``batch_size``
    tried: list[tuple[int, int | None, str]] = field(default_factory=list)  # (size, peak bytes, outcome)
    stopped_by: str = ""  # what ended the search
    under_compile: bool = False
    allocated_before: int | None = None  # CUDA: memory allocated before and after the search
    allocated_after: int | None = None

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size * self.grad_accum_steps

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _release(cuda: bool) -> None:
    """Free what the last size held, so the next size starts from the same memory."""
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
    else:
        release_host_memory()


def split_effective_batch(effective: int, largest: int, multiple: int = 8) -> tuple[int, int]:
    """(micro-batch, accumulation steps) for an ``effective`` batch when at most ``largest`` fits.

    The micro-batch divides the effective batch exactly (so the gradient is the same), and is a
    multiple of ``multiple`` when such a divisor fits.
    """
    if effective <= largest:
        return effective, 1
    divisors = [d for d in range(min(largest, effective), 0, -1) if effective % d == 0]
    aligned = [d for d in divisors if d % multiple == 0]
    micro = (aligned or divisors)[0]
    return micro, effective // micro


def find_batch_size(
    model: torch.nn.Module,
    optimizer_fn: Callable,
    loss_fn: Callable | None,
    batch: Any,
    plan: Plan | None = None,
    *,
    max_batch_size: int = 4096,
    memory_limit_bytes: int | None = None,
    margin: float = MARGIN,
    effective_batch_size: int | None = None,
    time_budget_s: float = 60.0,
    multiple: int = 8,
    step_fn: Callable | None = None,
    measure: Callable[[int], Trial] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> BatchSizeResult:
    """The largest micro-batch (a multiple of ``multiple``) whose training step fits in memory.

    ``batch`` is one sample batch from the loader; it is tiled to each size tried. With
    ``effective_batch_size`` the result keeps that many samples per optimizer step, through
    gradient accumulation when they do not fit at once. ``measure(size) -> Trial`` replaces
    the real trial (tests use it to fake a memory limit).
    """
    plan = (plan or Plan()).replace(grad_accum_steps=1, batch_size=None)
    device = resolve_device(plan.device)
    cuda = device.type == "cuda"
    if memory_limit_bytes is None:
        memory_limit_bytes = torch.cuda.get_device_properties(device).total_memory if cuda else host_memory_budget()
    usable = memory_limit_bytes * (1 - margin)

    def run_one(size: int) -> Trial:
        return run_trial(
            model, optimizer_fn, loss_fn, [resize_batch(batch, size)], plan, steps=1, warmup=1, step_fn=step_fn
        )

    real = measure is None
    if measure is None:
        measure = run_one

    result = BatchSizeResult(
        batch_size=0,
        grad_accum_steps=1,
        limit_bytes=int(memory_limit_bytes),
        margin=margin,
        peak_memory_bytes=None,
        under_compile=plan.compile is not False,
    )
    if cuda:
        torch.cuda.synchronize(device)
        result.allocated_before = torch.cuda.memory_allocated(device)
    started = clock()
    peaks: dict[int, int | None] = {}
    last_cost: dict[str, float] = {}

    def affordable(size: int) -> bool:
        if not last_cost:
            return True
        # The steps grow with the batch; the rest (copying the model, first-call imports) does not.
        cost = last_cost["overhead"] + last_cost["steps"] * size / last_cost["size"] * 1.5
        return clock() - started + cost <= time_budget_s

    def fits(size: int) -> bool:
        if real:
            _release(cuda)
        t0 = clock()
        trial = measure(size)
        wall = clock() - t0
        steps = min(wall, trial.warmup_s + sum(trial.step_times_s)) if trial.ok else wall
        last_cost.update(steps=steps, overhead=wall - steps, size=size)
        peak = trial.peak_memory_bytes
        if trial.error:
            oom = "OutOfMemory" in trial.error or "out of memory" in trial.error.lower()
            outcome = "out of memory" if oom else f"failed: {trial.error}"
            if not oom and not peaks:
                raise RuntimeError(
                    f"find_batch_size: a training step at batch size {size} fails for a reason other "
                    f"than memory: {trial.error}"
                )
        elif peak is not None and peak > usable:
            outcome = f"over {usable / 2**20:,.0f} MiB"
        else:
            outcome = "fits"
        result.tried.append((size, peak, outcome))
        if outcome == "fits":
            peaks[size] = peak
        return outcome == "fits"

    size = min(round_to_multiple(batch_size_of(batch), multiple), round_to_multiple(max_batch_size, multiple))
    lo = hi = None
    if fits(size):
        lo = size
        while lo * 2 <= max_batch_size:
            if not affordable(lo * 2):
                result.stopped_by = "time budget"
                break
            if fits(lo * 2):
                lo *= 2
            else:
                hi = lo * 2
                break
        else:
            result.stopped_by = f"max_batch_size={max_batch_size}"
    else:
        hi = size
        while hi > multiple:
            size = round_to_multiple(hi // 2, multiple)
            if fits(size):
                lo = size
                break
            hi = size
        if lo is None:
            raise RuntimeError(
                f"find_batch_size: even a batch of {multiple} does not fit in "
                f"{usable / 2**20:,.0f} MiB ({result.tried[-1][2]}); lower the memory a step needs "
                "(bf16, activation checkpointing) or raise memory_limit_bytes"
            )
    while hi is not None and hi - lo > multiple:
        mid = round_to_multiple((lo + hi) // 2, multiple)
        if mid <= lo or mid >= hi:
            break
        if not affordable(mid):
            result.stopped_by = "time budget"
            break
        if fits(mid):
            lo = mid
        else:
            hi = mid
    if not result.stopped_by:
        result.stopped_by = f"{hi} does not fit" if hi is not None else "search ended"
    result.batch_size, result.peak_memory_bytes = lo, peaks.get(lo)
    if effective_batch_size is not None:
        result.batch_size, result.grad_accum_steps = split_effective_batch(effective_batch_size, lo, multiple)
    _release(cuda)
    if cuda:
        torch.cuda.synchronize(device)
        result.allocated_after = torch.cuda.memory_allocated(device)
    return result
