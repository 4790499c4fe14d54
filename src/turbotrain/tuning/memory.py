"""Host memory as the finders see it: what is resident, what may still be used, freeing it back."""

from __future__ import annotations

import ctypes
import gc

from ..hardware import detect, read_proc_kib

__all__ = ["resident_bytes", "available_bytes", "host_memory_budget", "release_host_memory"]


def resident_bytes() -> int:
    """This process's resident memory now (VmRSS), 0 where unavailable."""
    kib = read_proc_kib("/proc/self/status", "VmRSS:")
    return kib * 1024 if kib is not None else 0


def available_bytes() -> int:
    """What the system reports it can still hand out (MemAvailable; total RAM where unknown)."""
    kib = read_proc_kib("/proc/meminfo", "MemAvailable:")
    return kib * 1024 if kib is not None else detect("cpu").memory_bytes


def host_memory_budget() -> int:
    """What this process may grow to: resident now plus what the system reports available."""
    return resident_bytes() + available_bytes()


def release_host_memory() -> None:
    """Hand freed heap back to the OS, so the next measurement's peak is not the last one's leftovers."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: peaks may read high, which only errs on the safe side
        pass
