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
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ...hardware import LoadSample, children_busy_cores, other_busy_cores, thread_env
from ...measure import MIN_GAIN

__all__ = ["machine_facts", "MachineFacts", "NoiseWarning", "noise_state", "noise_floor", "others_share"]

# A window is "noisy" past these: another process kept a quarter of a core busy (a neighbour pinned to
# one of our cores gets only about half of it while our threads want it too), steps spread 1.5x from p10
# to p90, or a tenth of the step went to waiting for a CPU another process held.
BUSY_OTHERS_CORES = 0.25
DISPERSION = 1.5
INTERFERENCE_SHARE = 0.10


@dataclass(frozen=True)
class MachineFacts:
    """What the report states about the machine (JSON ``machine``). Every fact may be None (not known, or a
    hand-made report that leaves it out): readers check. ``thread_env``: the thread-count environment variables
    that were set, in :func:`~turbotrain.hardware.thread_env`'s order (JSON: keys of their own, after the rest)."""

    usable_cores: int | None = None
    host_cores: int | None = None
    cpu_quota: float | None = None
    affinity_cores: int | None = None
    intra_op_threads: int | None = None
    interop_threads: int | None = None
    dataloader_workers: int | None = None
    worker_load: float | None = None  # cores the script's own workers kept busy: not noise
    other_load: float | None = None
    loadavg_1m: float | None = None
    dispersion: float | None = None  # step time p90/p10
    interference_share: float | None = None
    thread_env: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "usable_cores": self.usable_cores,
            "host_cores": self.host_cores,
            "cpu_quota": self.cpu_quota,
            "affinity_cores": self.affinity_cores,
            "intra_op_threads": self.intra_op_threads,
            "interop_threads": self.interop_threads,
            "dataloader_workers": self.dataloader_workers,
            "worker_load": self.worker_load,
            "other_load": self.other_load,
            "loadavg_1m": self.loadavg_1m,
            "dispersion": self.dispersion,
            "interference_share": self.interference_share,
            **dict(self.thread_env),
        }


def machine_facts(
    hw: Any,
    step_seconds: list[float],
    interference_share: float,
    loaders: list[Any],
    load: tuple[LoadSample | None, LoadSample | None],
    threads: int | None = None,
    job_load: float = 0.0,
) -> MachineFacts:
    """What the report states about the machine. ``job_load``: cores the job's other ranks on this host kept
    busy, which are not other processes' load."""
    usable = hw.usable_cores
    workers = max((r.settings.get("num_workers", 0) for r in loaders), default=0)
    ordered = sorted(step_seconds)
    p10 = ordered[int(0.1 * (len(ordered) - 1))] if ordered else 0.0
    p90 = ordered[int(round(0.9 * (len(ordered) - 1)))] if ordered else 0.0
    others = other_busy_cores(*load)
    if others is not None and job_load:
        others = round(max(0.0, others - job_load), 2)
    return MachineFacts(
        usable_cores=usable,
        host_cores=os.cpu_count(),
        cpu_quota=hw.cpu_quota,
        affinity_cores=hw.affinity_cores,
        intra_op_threads=threads if threads is not None else torch.get_num_threads(),
        interop_threads=torch.get_num_interop_threads(),
        dataloader_workers=workers,
        worker_load=children_busy_cores(*load),
        other_load=others,
        loadavg_1m=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        dispersion=round(p90 / p10, 2) if p10 > 0 else None,
        interference_share=round(interference_share, 3),
        thread_env=tuple(thread_env().items()),
    )


def others_share(load: tuple[LoadSample | None, LoadSample | None]) -> float:
    """The part of the main thread's run-queue wait that other processes caused, in proportion to the cores
    they and the script's own children (DataLoader workers) kept busy over ``load``'s two samples: workers
    taking a core from training cost the script that time (they are its choice, and fewer of them is a
    fix); it is not noise to take out. 1.0 when the workers were idle or the load is unknown."""
    workers, others = children_busy_cores(*load), other_busy_cores(*load)
    if not workers or others is None:
        return 1.0
    return others / (others + workers)


NOISE_FLOOR_CAP = 1.0


def noise_floor(machine: MachineFacts) -> float:
    """The least relative gain one timing pair taken in this window can tell from noise: half the p10..p90
    spread of its steps, or the share of the step lost to other processes, whichever is larger; at most
    1.0 (x2), since what spreads steps 20x (threads fighting for a core) is often what the fix removes,
    and interleaved rounds that agree are evidence of their own (:func:`turbotrain.measure.judge`)."""
    spread = ((machine.dispersion or 1.0) - 1.0) / 2
    return min(NOISE_FLOOR_CAP, max(0.0, spread, machine.interference_share or 0.0))


@dataclass(frozen=True)
class NoiseWarning:
    """Why the window was too noisy to trust small gains, and the least gain it can still tell (JSON ``noise``)."""

    level: Literal["high"]
    reasons: tuple[str, ...]
    min_speedup: float  # gains under this ratio cannot be told from noise

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "reasons": list(self.reasons), "min_speedup": self.min_speedup}


def noise_state(machine: MachineFacts) -> NoiseWarning | None:
    """The warning the report opens with when the machine was too noisy to trust small gains."""
    reasons = []
    others, dispersion = machine.other_load, machine.dispersion
    if others is not None and others >= BUSY_OTHERS_CORES:
        reasons.append(
            f"other processes kept {others:.1f} of {machine.usable_cores} usable cores busy during the measured steps"
        )
    if dispersion is not None and dispersion >= DISPERSION:
        reasons.append(f"step times spread {dispersion:.1f}x from p10 to p90")
    interference = machine.interference_share or 0.0
    if interference >= INTERFERENCE_SHARE:
        reasons.append(f"{interference:.0%} of the step went to waiting for a CPU another process held")
    if not reasons:
        return None
    # A speed-up ratio (x1.4), not a gain fraction like measure.MIN_GAIN (0.03): one name, one meaning.
    return NoiseWarning("high", tuple(reasons), min_speedup=round(1.0 + max(MIN_GAIN, noise_floor(machine)), 2))
