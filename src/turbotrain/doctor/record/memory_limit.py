"""``--memory-limit``: the script runs as if its device had only so much memory, so that a run can be made to
run out of memory, and its fixes checked, at a size this machine would grant (or to ask whether a step fits a
smaller device than the one at hand).

On the CPU the process's data segment (what ``RLIMIT_DATA`` counts: the heap and private writable mappings,
where tensors live) may grow by the limit beyond what it held when the limit was taken; a larger allocation is
refused with the allocator's own out-of-memory error. Where CUDA is available the caching allocator is capped
instead (``torch.cuda.set_per_process_memory_fraction`` on the process's device) and host memory is left alone.

The limit is enforced while the script runs and while the doctor measures a step in this process
(:func:`enforced`), not while the doctor analyses: the rules and the report never meet it, nor does the profiler
window inside the script's run (:func:`lift`).
"""

from __future__ import annotations

import ctypes
import os
import resource
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .window_memory import status_kib

__all__ = ["MemoryLimit", "memory_limit", "enforced", "lift", "active", "data_bytes", "plain_heap", "trim_heap"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_EXACT = 128 * 1024  # the mmap threshold under a limit, and glibc's own trim threshold
_PLAIN_MMAP, _PLAIN_TRIM = 32 * 2**20, 64 * 2**20  # where glibc's dynamic thresholds settle in a long run


def data_bytes() -> int:
    """The process's data segment now (``VmData``): what ``RLIMIT_DATA`` counts."""
    return (status_kib("VmData") or 0) * 1024


def _device() -> str:
    if not torch.cuda.is_available():
        return "cpu"
    # A rank of a job uses its local rank's device; one process, the current one (without making a context).
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"


def _exact_large_allocations() -> None:
    """glibc serves a large block from its heap once one was freed (its mmap threshold rises to 32 MiB) and keeps
    freed heap: the data segment then runs ahead of the live tensors by chance. A fixed threshold maps every
    block of 128 KiB or more on its own and unmaps it when freed, so the segment follows what is live."""
    libc = _glibc()
    if libc is not None:  # not glibc: its allocator is left as it is
        libc.mallopt(_M_MMAP_THRESHOLD, _EXACT)


def _glibc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _start_thread_pool() -> None:
    """torch's intra-op threads start at the first parallel op, each with its stack (8 MiB by default), which the
    data segment counts: started before the base, they are not the script's memory (on 16 cores, 120 MiB of it)."""
    torch.ones(1 << 20).add_(1)  # over torch's grain size: runs on the pool


@dataclass(frozen=True)
class MemoryLimit:
    """``limit_bytes`` for the step on ``device``; on the CPU counted from ``base_bytes``, the data segment when
    the limit was taken."""

    limit_bytes: int
    device: str
    base_bytes: int

    @classmethod
    def now(cls, limit_bytes: int) -> MemoryLimit:
        # torch's optimizers import dynamo when they are made, torch.compile(model) imports Inductor: their ~70 and
        # ~45 MiB of data are torch's, not the script's (nanoGPT's compiled twin died under 100 MiB of them).
        # Imported for their side effect on the data segment, before the base.
        import torch._dynamo
        import torch._inductor.compile_fx  # noqa: F401 - for the side effect above

        device = _device()
        if device == "cpu":
            _exact_large_allocations()
            _start_thread_pool()
        return cls(limit_bytes, device, data_bytes() if device == "cpu" else 0)

    def used_bytes(self) -> int:
        """What counts against the limit now."""
        if self.device == "cpu":
            return max(0, data_bytes() - self.base_bytes)
        return torch.cuda.memory_reserved(self.device)

    @contextmanager
    def enforced(self, held_bytes: int | None = None) -> Iterator[None]:
        """The limit in force while the block runs; the previous setting after it. ``held_bytes``: a step the
        doctor measures, which already holds this much of the limit: it may grow by the rest from now (whatever
        the process holds beside it, the script's own model among it)."""
        if self.device != "cpu":
            total = torch.cuda.get_device_properties(self.device).total_memory
            allowed = self.limit_bytes
            if held_bytes is not None:
                allowed = torch.cuda.memory_reserved(self.device) + max(0, self.limit_bytes - held_bytes)
            torch.cuda.set_per_process_memory_fraction(min(1.0, allowed / total), self.device)
            try:
                yield
            finally:
                torch.cuda.set_per_process_memory_fraction(1.0, self.device)
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if held_bytes is None:
            wanted = self.base_bytes + self.limit_bytes
        else:
            wanted = data_bytes() + max(0, self.limit_bytes - held_bytes)
        _set_data_limit(wanted, hard)
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


_active: MemoryLimit | None = None


def _set_data_limit(wanted: int, hard: int) -> None:
    """``RLIMIT_DATA``'s soft limit at ``wanted``, never above the hard one."""
    resource.setrlimit(resource.RLIMIT_DATA, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard))


def active() -> MemoryLimit | None:
    """The limit this process runs under, if any."""
    return _active


@contextmanager
def memory_limit(limit_bytes: int | None) -> Iterator[MemoryLimit | None]:
    """The process's limit while the block runs, counted from now (None: no limit)."""
    global _active
    if limit_bytes is None:
        yield None
        return
    if limit_bytes <= 0:
        raise ValueError(f"a memory limit must be positive bytes, not {limit_bytes}")
    saved, _active = _active, MemoryLimit.now(limit_bytes)
    try:
        yield _active
    finally:
        _active = saved


def lift() -> Callable[[], None]:
    """Lift the limit for the doctor's own work inside the script's run (the profiler window, whose event buffers
    are the doctor's, not the step's); the call returned puts it back, raised by what the process kept from that
    work, so the script's steps after it have the room they had before. Nothing to do on CUDA: the profiler's
    buffers are host memory, which the limit leaves alone there."""
    if _active is None or _active.device != "cpu":
        return lambda: None
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    before = data_bytes()
    resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))

    def restore() -> None:
        _set_data_limit(soft if soft == resource.RLIM_INFINITY else soft + max(0, data_bytes() - before), hard)

    return restore


@contextmanager
def enforced(held_bytes: int | None = None) -> Iterator[None]:
    """The process's limit in force while the block runs (:meth:`MemoryLimit.enforced`); nothing where there is
    none."""
    if _active is None:
        yield
        return
    with _active.enforced(held_bytes):
        yield


@contextmanager
def plain_heap() -> Iterator[None]:
    """glibc's thresholds as a process without the limit has them once its steps repeat, while the block runs: a step
    timed here does not pay for mapping and unmapping every block of 128 KiB or more, which the limit's exact count
    needs and no device has. The limit's thresholds after it, and the heap's free top given back (a block the
    step left above it keeps the rest: harmless after the doctor's last measured step, where this is used)."""
    libc = _glibc() if _active is not None and _active.device == "cpu" else None
    if libc is None:
        yield
        return
    libc.mallopt(_M_MMAP_THRESHOLD, _PLAIN_MMAP)
    libc.mallopt(_M_TRIM_THRESHOLD, _PLAIN_TRIM)
    try:
        yield
    finally:
        libc.mallopt(_M_TRIM_THRESHOLD, _EXACT)
        libc.mallopt(_M_MMAP_THRESHOLD, _EXACT)
        trim_heap()


def trim_heap() -> None:
    """Give the heap's free top back under a CPU limit: blocks a step took from the heap and freed would otherwise
    count in the data segment as if live."""
    libc = _glibc() if _active is not None and _active.device == "cpu" else None
    if libc is not None:
        libc.malloc_trim(0)
