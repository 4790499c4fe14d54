"""From recorded steps to the report's numbers: step-time statistics, the breakdown, the bottleneck.

The breakdown's categories add up to the measured step time: every second of every measured
step is charged to exactly one category (see :meth:`StepRecord.categories`).

Per-op dispatch and interpreter time of the forward and backward is ``python_overhead``: on the CPU
the part of ``compute`` that :mod:`turbotrain.doctor.analysis.overhead` counts as per-op cost (ATen ops
times the cost of an op whose kernel does nothing). The optimizer's own per-op cost stays in
``optimizer`` (a step whose optimizer loops over 800 small tensors is ``optimizer``-bound: foreach fixes
it), and ``dispatch`` says how much of it is overhead. On CUDA, compute and optimizer are the device's
time (CUDA events around each phase); device idle time while the host was issuing the step's ops is
``python_overhead`` (the device waits on Python), and the rest of the step goes to what the host was
doing (data, copies, syncs).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..record.measurements import CATEGORIES, Category, Phase, StepRecord
from ..record.recurring import Periodic, beyond_window, find_periodic

__all__ = ["Breakdown", "Overhead", "Periodic", "compute_breakdown", "find_periodic", "select_steps"]


@dataclass
class Breakdown:
    steps: list[int]  # indices of the steps the numbers come from
    step_seconds: list[float]
    seconds: dict[Category, float]  # mean seconds per step, per category
    shares: dict[Category, float]  # fractions of step time; sum to 1
    bottleneck: Category
    timeline: list[dict[str, Any]] = field(default_factory=list)
    warmup_included: bool = False  # too few steps ran: warm-up steps are in the numbers
    overhead: dict[str, Any] = field(default_factory=dict)
    interference_s: float = 0.0  # mean seconds per step lost to other processes (see below)
    raw_shares: dict[Category, float] = field(default_factory=dict)  # as timed (before any stall was taken out)
    dispatch: dict[Category, float] = field(default_factory=dict)  # seconds per step of each category that are overhead
    periodic: list["Periodic"] = field(default_factory=list)  # recurring work, amortised into the numbers
    settling: list[float] = field(default_factory=list)  # seconds of steps left out as still warming up

    @property
    def dispatch_share(self) -> float:
        """Share of step time that is per-op dispatch and interpreter overhead, whatever phase holds it."""
        total = sum(self.seconds.values())
        own = sum(self.dispatch.values()) + self.seconds.get("python_overhead", 0.0)
        return own / total if total > 0 else 0.0

    def dispatch_of(self, category: Category) -> float:
        """Share of ``category``'s own time that is overhead."""
        seconds = self.seconds.get(category, 0.0)
        return min(1.0, self.dispatch.get(category, 0.0) / seconds) if seconds > 0 else 0.0

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


def settling_steps(chosen: list[StepRecord], warmup: int, periodic_steps: set[int]) -> int:
    """How many steps right after the warm-up are still settling (lazy init, first-touch allocations):
    each over 3x the window's median step and a millisecond, none of them periodic work. Left in, they
    would put a mean far from the median, and the bar far from the headline."""
    if len(chosen) < 6 or chosen[0].index != warmup:
        return 0
    limit = 3 * statistics.median(s.duration for s in chosen) + STALL_FLOOR_S
    count = 0
    for step in chosen:
        if step.index in periodic_steps or step.duration <= limit:
            break
        count += 1
    return count if len(chosen) - count >= 4 else 0


@dataclass
class Overhead:
    """What part of compute and optimizer time is dispatch/interpreter overhead (see the module docs)."""

    method: str = "none"  # "counted" (ATen ops x per-op floor), "estimated" (profiled ops) or "none"
    compute_share: float = 0.0  # share of compute (forward+backward+glue) that is overhead
    optimizer_s: float = 0.0  # seconds per step of the optimizer beyond its memory traffic
    estimate_s: float = 0.0  # the profiler's op-count estimate, seconds per step (method "estimated")
    detail: dict[str, float] = field(default_factory=dict)


# The model's own time, which the estimated overhead is carved out of in proportion.
_MODEL: tuple[Category, ...] = ("compute", "optimizer")


def _carve_overhead(cats: dict[Category, float], overhead: Overhead) -> dict[Category, float]:
    """Seconds of compute and of optimizer that are overhead (the model of :class:`Overhead`)."""
    if overhead.method == "counted":
        return {
            "compute": cats["compute"] * overhead.compute_share,
            "optimizer": min(overhead.optimizer_s, 0.95 * cats["optimizer"]),
        }
    if overhead.method == "estimated":
        pool = cats["compute"] + cats["optimizer"]
        take = min(overhead.estimate_s, 0.95 * pool)
        return {k: take * cats[k] / pool for k in _MODEL} if pool > 0 else {}
    return {}


def _gpu_categories(cats: dict[Category, float], duration: float, device: dict[Phase, float]) -> dict[Category, float]:
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
_STALL_PRONE: tuple[Category, ...] = ("compute", "optimizer", "python_overhead", "host_to_device", "host_sync")
STALL_FLOOR_S = 1e-3
SCHEDULER_SLICE_S = 5e-3  # about what Linux gives a task before another runnable one gets the core


def _remove_preemption(per_step: list[dict[Category, float]], preempted: list[float]) -> list[float]:
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


def _remove_stalls(per_step: list[dict[Category, float]]) -> list[float]:
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


# Work that comes back every N steps (validation, checkpoints) shows as a few steps whose
# outside_step time towers over the others'. (A new epoch's DataLoader start is persistent-workers'.)
def _amortise(per_step: list[dict[Category, float]], chosen: list[StepRecord], periodic: list[Periodic]) -> None:
    """Replace each periodic spike in the window by its cost spread over its period (in place), so the
    numbers do not depend on how many occurrences the window happened to hold."""
    for p in periodic:
        if not p.every:
            continue
        ordinary = {other: statistics.median(cats[other] for cats in per_step) for other in p.around if per_step}
        for step, cats in zip(chosen, per_step):
            if step.index in p.steps:
                cats[p.category] = p.base_s
                cats.update(ordinary)  # their excess is in the cost spread below
            cats[p.category] += p.amortised_s


def _fractions(seconds: dict[Category, float]) -> dict[Category, float]:
    total = sum(seconds.values())
    return {k: (v / total if total > 0 else 0.0) for k, v in seconds.items()}


def compute_breakdown(
    steps: list[StepRecord],
    warmup: int,
    overhead: Overhead | None = None,
    gpu_seconds: dict[int, dict[Phase, float]] | None = None,
    others_share: float = 1.0,
    watched: list[Periodic] | None = None,
) -> Breakdown:
    """The breakdown over the measured steps.

    ``seconds`` (mean per step, per category) plus ``interference_s`` (time other processes
    took the CPU from the script: the thread's run-queue wait on Linux, times ``others_share``, the part
    of it other processes rather than the script's own DataLoader workers caused; elsewhere single steps
    where compute or the optimizer ran over three times their median, by more than a
    millisecond) add up to the mean measured step time.
    """
    chosen, warm_included = select_steps(steps, warmup)
    periodic = find_periodic(steps)
    periodic += beyond_window(watched or [], periodic)  # found by the watch after the window: its cost amortised too
    settling = settling_steps(chosen, warmup, {i for p in periodic for i in p.steps})
    settled, chosen = [s.duration for s in chosen[:settling]], chosen[settling:]
    overhead = overhead or Overhead()
    per_step = []
    raw = dict.fromkeys(CATEGORIES, 0.0)
    dispatch: dict[Category, float] = {"optimizer": 0.0}
    for step in chosen:
        cats = step.categories()
        for key, value in cats.items():
            raw[key] += value
        if gpu_seconds and step.index in gpu_seconds:
            cats = _gpu_categories(cats, step.duration, gpu_seconds[step.index])
        per_step.append(cats)
    if chosen and all(s.preempted is not None for s in chosen):
        removed = _remove_preemption(per_step, [s.preempted * others_share for s in chosen if s.preempted is not None])
    else:
        removed = _remove_stalls(per_step)
    _amortise(per_step, chosen, periodic)
    for step, cats in zip(chosen, per_step):
        if not (gpu_seconds and step.index in gpu_seconds):  # on CUDA the idle device is python_overhead
            carved = _carve_overhead(cats, overhead)
            # The forward+backward's per-op cost is python_overhead; the optimizer's stays its own (foreach fixes it).
            moved = carved.get("compute", 0.0)
            cats["compute"] -= moved
            cats["python_overhead"] += moved
            dispatch["optimizer"] += carved.get("optimizer", 0.0)
    totals = dict.fromkeys(CATEGORIES, 0.0)
    timeline: list[dict[str, Any]] = []
    for step, cats, lost in zip(chosen, per_step, removed):
        for key, value in cats.items():
            totals[key] += value
        timeline.append(
            {
                "step": step.index,
                "ms": round(step.duration * 1e3, 3),
                **{k: round(v * 1e3, 3) for k, v in cats.items()},
                "interference": round(lost * 1e3, 3),
            }
        )
    durations = [s.duration for s in chosen]
    n = max(1, len(chosen))
    shares = _fractions(totals)
    bottleneck: Category = max(shares, key=lambda k: shares[k]) if sum(totals.values()) > 0 else "compute"
    return Breakdown(
        steps=[s.index for s in chosen],
        step_seconds=durations,
        seconds={k: v / n for k, v in totals.items()},
        shares=shares,
        bottleneck=bottleneck,
        timeline=timeline,
        warmup_included=warm_included,
        interference_s=sum(removed) / n,
        raw_shares=_fractions(raw),
        dispatch={k: v / n for k, v in dispatch.items()},
        periodic=periodic,
        settling=settled,
        overhead={
            "method": overhead.method,
            "compute_share": overhead.compute_share,
            "optimizer_ms": overhead.optimizer_s * 1e3,
            "estimate_ms": overhead.estimate_s * 1e3,
            **overhead.detail,
        },
    )
