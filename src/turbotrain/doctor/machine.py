"""The machine as the run saw it: the cores it may use, torch's threads, other processes' load, noise.

A doctor that only times the script cannot tell a slow script from a busy machine. Two readings
of ``/proc/stat`` (one when the measured steps start, one when they end) give the CPU time every
process spent during the window; taking out this process and its children (the DataLoader's
workers) leaves what *other* processes kept busy. With the step-time dispersion that says how far
a measured gain can be trusted (:func:`noise_state`), and it feeds the thread-oversubscription
rule: torch's intra-op pool sizes itself to the cores it sees, and when another process holds one
of them every parallel op waits at a barrier for a descheduled thread.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["LoadSample", "sample_load", "other_busy_cores", "machine_facts", "noise_state", "noise_floor"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# A window is "noisy" past these: another process kept half a core busy, steps spread 1.5x from p10 to
# p90, or a tenth of the step went to waiting for a CPU another process held.
BUSY_OTHERS_CORES = 0.5
DISPERSION = 1.5
INTERFERENCE_SHARE = 0.10


@dataclass(frozen=True)
class LoadSample:
    at: float              # time.monotonic()
    busy_s: float          # CPU seconds every process on the machine spent so far (all cores)
    own_s: float           # CPU seconds this process and its live children spent so far


def _proc_stat_busy_s() -> float | None:
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(v) for v in fields[:8]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)   # idle + iowait
    return (sum(ticks) - idle) / _TICKS


def _pid_cpu_s(pid: int | str) -> float:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS   # utime + stime (all threads)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(c) for c in fh.read().split()]
        except OSError:
            continue
    return out


def sample_load() -> LoadSample | None:
    """One reading; None where /proc is not there (not Linux)."""
    busy = _proc_stat_busy_s()
    if busy is None:
        return None
    me = os.getpid()
    own = _pid_cpu_s(me) + sum(_pid_cpu_s(c) for c in _children(me))
    return LoadSample(time.monotonic(), busy, own)


def other_busy_cores(start: LoadSample | None, end: LoadSample | None) -> float | None:
    """Cores other processes kept busy on average between two readings (None when unknown).

    Children that started or ended between the readings make this approximate by their own CPU
    time; DataLoader workers of a persistent loader live through the window.
    """
    if start is None or end is None or end.at - start.at < 0.05:
        return None
    others = (end.busy_s - start.busy_s) - (end.own_s - start.own_s)
    return max(0.0, others / (end.at - start.at))


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def machine_facts(hw: Any, step_seconds: list[float], interference_share: float, loaders: list[Any],
                  load: tuple[LoadSample | None, LoadSample | None], threads: int | None = None) -> dict[str, Any]:
    """What the report states about the machine (all keys optional in readers)."""
    usable = getattr(hw, "usable_cores", None) or hw.cpu_cores
    workers = max((r.settings.get("num_workers", 0) for r in loaders), default=0)
    ordered = sorted(step_seconds)
    p10 = ordered[int(0.1 * (len(ordered) - 1))] if ordered else 0.0
    p90 = ordered[int(round(0.9 * (len(ordered) - 1)))] if ordered else 0.0
    others = other_busy_cores(*load)
    facts: dict[str, Any] = {
        "usable_cores": usable,
        "host_cores": os.cpu_count(),
        "cpu_quota": getattr(hw, "cpu_quota", None),
        "affinity_cores": getattr(hw, "affinity_cores", None) or hw.cpu_cores,
        "intra_op_threads": threads if threads is not None else torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "dataloader_workers": workers,
        "other_load": round(others, 2) if others is not None else None,
        "loadavg_1m": _loadavg(),
        "dispersion": round(p90 / p10, 2) if p10 > 0 else None,
        "interference_share": round(interference_share, 3),
    }
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(name):
            facts[name] = os.environ[name]
    return facts


def noise_floor(machine: dict[str, Any]) -> float:
    """The least relative gain this window can tell from noise: half the p10..p90 spread of its steps,
    or the share of the step lost to other processes, whichever is larger."""
    spread = ((machine.get("dispersion") or 1.0) - 1.0) / 2
    return max(0.0, spread, machine.get("interference_share") or 0.0)


def noise_state(machine: dict[str, Any]) -> dict[str, Any] | None:
    """The warning the report opens with when the machine was too noisy to trust small gains."""
    reasons = []
    others, dispersion = machine.get("other_load"), machine.get("dispersion")
    if others is not None and others >= BUSY_OTHERS_CORES:
        reasons.append(f"other processes kept {others:.1f} of {machine.get('usable_cores')} usable cores busy "
                       "during the measured steps")
    if dispersion is not None and dispersion >= DISPERSION:
        reasons.append(f"step times spread {dispersion:.1f}x from p10 to p90")
    if (machine.get("interference_share") or 0.0) >= INTERFERENCE_SHARE:
        reasons.append(f"{machine['interference_share']:.0%} of the step went to waiting for a CPU another "
                       "process held")
    if not reasons:
        return None
    return {"level": "high", "reasons": reasons, "min_gain": round(1.0 + max(0.03, noise_floor(machine)), 2)}
