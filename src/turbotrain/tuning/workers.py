"""The num_workers finder: add DataLoader workers while the loader gets faster, then stop.

"Increase num_workers slowly and stop once there is no more improvement" (the Lightning
speed guide). Counts 0, 1, 2, ... are timed with :func:`turbotrain.measure.time_loader`;
the search stops when ``patience`` counts in a row fail to beat the best by ``min_gain``
(one worker alone is often no faster than the main process, so one miss is forgiven), when
the loader already delivers comfortably more than training consumes, or at the bound set
by the CPU cores and by memory (each worker holds its own prefetched batches and a share
of the dataset's pages). The result sets ``persistent_workers`` with workers (no restart
every epoch) and ``pin_memory`` when training runs on a GPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from torch.utils.data import DataLoader

from ..data.loader import rebuild_loader
from ..data.transfer import tensors_in
from ..hardware import detect
from ..measure import time_loader
from .memory import available_bytes
from .report import format_rate

__all__ = ["WorkersResult", "find_num_workers", "worker_memory_estimate"]

WORKER_OVERHEAD_BYTES = 256 * 2**20
"""Private memory of one forked worker process before any batch (Python, torch, touched dataset pages)."""


@dataclass
class WorkersResult:
    num_workers: int
    persistent_workers: bool | None
    pin_memory: bool
    batches_per_s: float
    tried: list[tuple[int, float]] = field(default_factory=list)  # (workers, batches/s)
    bound: int = 0  # the most workers allowed
    bound_by: str = ""
    stopped_by: str = ""

    def plan_changes(self) -> dict[str, Any]:
        """The Plan switches to set (none when nothing could be timed: the loader's own stay)."""
        if not self.tried:
            return {}
        return {
            "num_workers": self.num_workers,
            "persistent_workers": self.persistent_workers,
            "pin_memory": self.pin_memory,
        }

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def worker_memory_estimate(sample_batch: Any, prefetch_factor: int = 2) -> int:
    """Bytes one worker is expected to hold: its prefetched batches plus a process's overhead."""
    batch_bytes = sum(t.numel() * t.element_size() for t in tensors_in(sample_batch))
    return WORKER_OVERHEAD_BYTES + 2 * prefetch_factor * batch_bytes


def find_num_workers(
    loader: DataLoader,
    *,
    device_type: str | None = None,
    max_workers: int | None = None,
    memory_budget_bytes: int | None = None,
    needed_batches_per_s: float | None = None,
    min_gain: float = 0.1,
    patience: int = 2,
    batches: int = 20,
    sample_batch: Any = None,
    time_loader_fn: Callable[..., float] = time_loader,
    time_budget_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> WorkersResult:
    """The worker count after which the loader stops getting faster.

    Counts go up to the CPU cores (or ``max_workers``, which replaces that bound: loaders that
    wait on storage or the network can use more workers than cores), and never past what
    ``memory_budget_bytes`` holds (default: half of what the system reports available).
    ``needed_batches_per_s`` (what training consumes) stops the search once the loader
    delivers 1.5x that: more workers would only cost memory. ``time_budget_s`` stops it before a count whose
    timing (as long as the last one's) would end past the budget: ResNet-50's 150 MB host batches took the tuner
    30-47 s past a 50-s budget on an H200's 16 cores.
    """
    if not isinstance(loader, DataLoader):
        raise TypeError(f"find_num_workers needs a torch DataLoader, got {type(loader).__name__}")
    hw = detect(device_type or "auto")
    pin = hw.is_cuda
    bound, bound_by = hw.cpu_cores, f"{hw.cpu_cores} CPU cores"
    if memory_budget_bytes is None:
        memory_budget_bytes = available_bytes() // 2
    if sample_batch is None:
        sample_batch = next(iter(rebuild_loader(loader, num_workers=0)))
    if max_workers is not None:  # the caller knows better than the core count (I/O-bound reads)
        bound, bound_by = max_workers, f"max_workers={max_workers}"
    per_worker = worker_memory_estimate(sample_batch, loader.prefetch_factor or 2)
    by_memory = int(memory_budget_bytes // per_worker)
    if by_memory < bound:
        bound = by_memory
        bound_by = f"memory ({memory_budget_bytes / 2**20:,.0f} MiB at ~{per_worker / 2**20:,.0f} MiB a worker)"
    bound = max(bound, 0)

    result = WorkersResult(0, None, pin, 0.0, bound=bound, bound_by=bound_by)
    best, misses = -1.0, 0
    started, last_s = clock(), 0.0
    for workers in range(bound + 1):
        if time_budget_s is not None and result.tried and clock() - started + last_s > time_budget_s:
            result.stopped_by = f"the time budget ({time_budget_s:.0f} s)"
            break
        began = clock()
        # Timed without persistence: it only matters across epochs, and a persistent iterator
        # would keep this trial's workers alive after the timing.
        try:
            rate = time_loader_fn(
                loader, batches=batches, num_workers=workers, pin_memory=pin, persistent_workers=False
            )
        except StopIteration:  # fewer batches than the warm-up takes: nothing to time
            result.stopped_by = "the loader has too few batches to time"
            break
        last_s = clock() - began
        result.tried.append((workers, rate))
        if rate > best * (1 + min_gain):
            best, misses = rate, 0
            result.num_workers, result.batches_per_s = workers, rate
        else:
            misses += 1
        if needed_batches_per_s and result.batches_per_s >= 1.5 * needed_batches_per_s:
            result.stopped_by = (
                f"{format_rate(result.batches_per_s)} batches/s is over 1.5x what training consumes "
                f"({format_rate(needed_batches_per_s)}/s)"
            )
            break
        if misses >= patience:
            result.stopped_by = f"{patience} more worker count(s) brought under {min_gain:.0%} more"
            break
    else:
        result.stopped_by = f"bound: {bound_by}"
    result.persistent_workers = True if result.num_workers > 0 else None
    return result
