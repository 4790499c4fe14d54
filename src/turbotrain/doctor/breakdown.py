"""From recorded steps to the report's numbers: step-time statistics, the breakdown, the bottleneck.

The breakdown's categories add up to the measured step time: every second of every measured
step is charged to exactly one category (see :meth:`StepRecord.categories`).

``python_overhead`` is carved out of compute and optimizer time as measured by
:mod:`turbotrain.doctor.overhead` (the part of forward+backward that does not grow with the
batch; the optimizer's time beyond its memory traffic). When it dominates, the step is bound by
per-op dispatch and interpreter time (tiny batches, tiny ops), not by the kernels' own work.
On CUDA, compute and optimizer are the device's time (CUDA events around each phase); device
idle time while the host was issuing the step's ops is python_overhead, and the rest of the
step goes to what the host was doing (data, copies, syncs).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from .records import CATEGORIES, StepRecord

__all__ = ["Breakdown", "Overhead", "compute_breakdown", "op_counts", "select_steps"]


def op_counts(profiler: Any, steps: int) -> dict[str, Any]:
    """Top-level aten ops per step in the profiler window, and the share of op time in pointwise ops."""
    if profiler is None or steps <= 0:
        return {}
    try:
        events = profiler.events()
    except Exception:  # noqa: BLE001 - a profiler that collected nothing
        return {}
    top = 0
    pointwise = total = 0.0
    for ev in events:
        if not ev.name.startswith("aten::"):
            continue
        parent, skip = ev.cpu_parent, False
        while parent is not None:
            name = parent.name
            if name.startswith("aten::") or name in _NOT_COMPUTE:
                skip = True  # nested in another op, or loading data / syncing / validating: not step compute
                break
            parent = parent.cpu_parent
        if skip:
            continue
        top += 1
        self_us = ev.self_cpu_time_total
        total += self_us
        if ev.name[6:].rstrip("_") in POINTWISE:
            pointwise += self_us
    return {"ops_per_step": top / steps, "pointwise_share": pointwise / total if total else 0.0}


_NOT_COMPUTE = frozenset(f"turbotrain/{p}" for p in ("data", "h2d", "sync", "eval", "eval_grad", "save"))

POINTWISE = frozenset("""add sub mul div neg exp log sigmoid tanh relu gelu silu erf pow sqrt rsqrt abs clamp
where masked_fill threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward mul_ add_
leaky_relu elu hardtanh dropout native_dropout fill zero copy maximum minimum sign reciprocal""".split())


@dataclass
class Breakdown:
    steps: list[int]                         # indices of the steps the numbers come from
    step_seconds: list[float]
    seconds: dict[str, float]                # mean seconds per step, per category
    shares: dict[str, float]                 # fractions of step time; sum to 1
    bottleneck: str
    timeline: list[dict[str, Any]] = field(default_factory=list)
    warmup_included: bool = False            # too few steps ran: warm-up steps are in the numbers
    overhead: dict[str, Any] = field(default_factory=dict)
    interference_s: float = 0.0              # mean seconds per step lost to other processes (see below)
    raw_shares: dict[str, float] = field(default_factory=dict)  # before python_overhead was carved out

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_seconds) if self.step_seconds else 0.0

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.step_seconds) if self.step_seconds else 0.0

    def quantile_s(self, q: float) -> float:
        data = sorted(self.step_seconds)
        if not data:
            return 0.0
        pos = q * (len(data) - 1)
        lo, hi = int(pos), min(int(pos) + 1, len(data) - 1)
        return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def select_steps(steps: list[StepRecord], warmup: int) -> tuple[list[StepRecord], bool]:
    """The steps to report on: measured ones; when too few ran, what there is (minus the first)."""
    chosen = [s for s in steps if s.index >= warmup and not s.profiled]
    if chosen:
        return chosen, False
    chosen = [s for s in steps if s.index >= warmup]
    if chosen:
        return chosen, False
    later = [s for s in steps if s.index >= 1]
    return (later or list(steps)), True


@dataclass
class Overhead:
    """What part of compute and optimizer time is dispatch/interpreter overhead (see the module docs)."""

    method: str = "none"              # "measured", "estimated" (op count x do-nothing op) or "none"
    compute_share: float = 0.0        # share of compute (forward+backward+glue) that is overhead
    optimizer_s: float = 0.0          # seconds per step of the optimizer beyond its memory traffic
    estimate_s: float = 0.0           # the op-count estimate, seconds per step (method "estimated")
    detail: dict[str, float] = field(default_factory=dict)


def _carve_overhead(cats: dict[str, float], overhead: Overhead) -> None:
    """Move the overhead out of compute and optimizer into python_overhead."""
    if overhead.method == "measured":
        move = {"compute": cats["compute"] * overhead.compute_share,
                "optimizer": min(overhead.optimizer_s, 0.95 * cats["optimizer"])}
    elif overhead.method == "estimated":
        pool = cats["compute"] + cats["optimizer"]
        take = min(overhead.estimate_s, 0.95 * pool)
        move = {k: take * cats[k] / pool for k in ("compute", "optimizer")} if pool > 0 else {}
    else:
        return
    for key, seconds in move.items():
        cats[key] -= seconds
        cats["python_overhead"] += seconds


def _gpu_categories(cats: dict[str, float], duration: float, device: dict[str, float]) -> dict[str, float]:
    """Compute/optimizer as device time; device-idle time split by what the host was doing."""
    compute = min(device.get("forward", 0.0) + device.get("backward", 0.0), duration)
    optimizer = min(device.get("optimizer", 0.0), duration - compute)
    idle = duration - compute - optimizer
    host = {k: v for k, v in cats.items() if k not in ("compute", "optimizer", "python_overhead")}
    host["python_overhead"] = cats["compute"] + cats["optimizer"] + cats["python_overhead"]
    host_total = sum(host.values())
    out = dict.fromkeys(CATEGORIES, 0.0)
    out["compute"], out["optimizer"] = compute, optimizer
    for key, value in host.items():
        out[key] += idle * value / host_total if host_total > 0 else 0.0
    if host_total <= 0:
        out["python_overhead"] += idle
    return out


# Without the kernel's run-queue accounting: categories where a rare, huge value is the machine
# (another process took the core), not the script. Data loading and outside_step are left alone
# there: their spikes (epoch start, validation) are real.
_STALL_PRONE = ("compute", "optimizer", "python_overhead", "host_to_device", "host_sync")
STALL_FLOOR_S = 1e-3
SCHEDULER_SLICE_S = 5e-3   # about what Linux gives a task before another runnable one gets the core


def _remove_preemption(per_step: list[dict[str, float]], preempted: list[float]) -> list[float]:
    """Take each step's measured run-queue wait out of the categories it inflated (in place).

    A short step is hit by one scheduler slice at most, in one place: the wait comes first out
    of the categories that ran over their median in that step (where the stall shows). A step
    of several slices is hit all along, so there the wait comes out in proportion to time.
    """
    removed = []
    medians = {k: statistics.median(c[k] for c in per_step) for k in CATEGORIES} if per_step else {}
    for cats, wait in zip(per_step, preempted):
        wait = min(wait, 0.99 * sum(cats.values()))
        left = wait
        excess = {k: max(0.0, cats[k] - medians[k]) for k in CATEGORIES}
        total_excess = sum(excess.values())
        if total_excess > 0 and left > 0 and sum(cats.values()) - wait < SCHEDULER_SLICE_S:
            take = min(left, total_excess)
            for k in CATEGORIES:
                cats[k] -= take * excess[k] / total_excess
            left -= take
        remaining = sum(cats.values())
        if left > 0 and remaining > 0:
            for k in CATEGORIES:
                cats[k] -= left * cats[k] / remaining
        removed.append(wait)
    return removed


def _remove_stalls(per_step: list[dict[str, float]]) -> list[float]:
    """Cap stall outliers at the category's median, in place; returns the seconds removed per step."""
    removed = [0.0] * len(per_step)
    if len(per_step) < 4:
        return removed
    for key in _STALL_PRONE:
        values = [cats[key] for cats in per_step]
        med = statistics.median(values)
        limit = 3 * med + STALL_FLOOR_S
        for i, cats in enumerate(per_step):
            if cats[key] > limit:
                removed[i] += cats[key] - med
                cats[key] = med
    return removed


def _fractions(seconds: dict[str, float]) -> dict[str, float]:
    total = sum(seconds.values())
    return {k: (v / total if total > 0 else 0.0) for k, v in seconds.items()}


def compute_breakdown(steps: list[StepRecord], warmup: int, overhead: Overhead | None = None,
                      gpu_seconds: dict[int, dict[str, float]] | None = None) -> Breakdown:
    """The breakdown over the measured steps.

    ``seconds`` (mean per step, per category) plus ``interference_s`` (time other processes
    took the CPU from the script: the thread's run-queue wait on Linux; elsewhere single steps
    where compute or the optimizer ran over three times their median, by more than a
    millisecond) add up to the mean measured step time.
    """
    chosen, warm_included = select_steps(steps, warmup)
    overhead = overhead or Overhead()
    per_step = []
    raw = dict.fromkeys(CATEGORIES, 0.0)
    for step in chosen:
        cats = step.categories()
        for key, value in cats.items():
            raw[key] += value
        _carve_overhead(cats, overhead)
        if gpu_seconds and step.index in gpu_seconds:
            cats = _gpu_categories(cats, step.duration, gpu_seconds[step.index])
        per_step.append(cats)
    if chosen and all(s.preempted is not None for s in chosen):
        removed = _remove_preemption(per_step, [s.preempted for s in chosen])
    else:
        removed = _remove_stalls(per_step)
    totals = dict.fromkeys(CATEGORIES, 0.0)
    timeline = []
    for step, cats, lost in zip(chosen, per_step, removed):
        for key, value in cats.items():
            totals[key] += value
        timeline.append({"step": step.index, "ms": round(step.duration * 1e3, 3),
                         **{k: round(v * 1e3, 3) for k, v in cats.items()}, "interference": round(lost * 1e3, 3)})
    durations = [s.duration for s in chosen]
    n = max(1, len(chosen))
    shares = _fractions(totals)
    bottleneck = max(shares, key=shares.get) if sum(totals.values()) > 0 else "compute"
    return Breakdown(
        steps=[s.index for s in chosen], step_seconds=durations,
        seconds={k: v / n for k, v in totals.items()}, shares=shares, bottleneck=bottleneck,
        timeline=timeline, warmup_included=warm_included, interference_s=sum(removed) / n,
        raw_shares=_fractions(raw),
        overhead={"method": overhead.method, "compute_share": overhead.compute_share,
                  "optimizer_ms": overhead.optimizer_s * 1e3, "estimate_ms": overhead.estimate_s * 1e3,
                  **overhead.detail},
    )
