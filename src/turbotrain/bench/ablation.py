"""Which plans the bench measures for a workload, and why some are skipped.

For each workload: the naive plan; every registry speed-up alone on top of naive (its
``BenchEntry.changes``); the cumulative fast plan (``Plan.fast(model)``); and the tuned plan
when ``turbotrain.tuning`` is installed. Every registry entry gets a row, measured or skipped
with the reason (not benchmarked on this workload, the hardware cannot do it, ...).

Switches that act on how batches reach the device (pinning, non-blocking copies, prefetch,
workers) do nothing when batches already sit on the device, so their rows go through the
DataLoader every step ("loader" path) and compare against the naive plan on that same path.

The ``data`` workload reads files, so each of its rows also names a *source*: plain reads over
HTTP (naive and the registry rows), ``tt.data.FileDataset`` without and with a disk cache (rows
of their own, as documented data options; the fast and tuned plans read through the cache), and
plain reads of the same files on local disk (the ceiling).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from ..hardware import Hardware
from ..plan import Plan
from ..speedups.registry import Speedup, all_speedups
from .data_workload import CACHE, FILES, LOCAL, PLAIN, SOURCES
from .workload import Workload

__all__ = [
    "Candidate",
    "candidates",
    "tuned_candidate",
    "tuning_off",
    "insert_after_fast",
    "DATA_PATH_FIELDS",
    "RESIDENT",
    "LOADER",
]

RESIDENT, LOADER = "resident", "loader"

# Plan fields whose effect is on the way batches reach the device.
DATA_PATH_FIELDS = frozenset({"pin_memory", "non_blocking", "device_prefetch", "num_workers", "persistent_workers"})


@dataclass
class Candidate:
    """One row of the ablation: a plan to measure, or the reason it is not measured."""

    label: str
    kind: str  # "naive", "alone", "fast", "tuned"; data: also "option", "reference"
    plan: Plan | None
    path: str = RESIDENT  # RESIDENT: batches already on the device; LOADER: through the DataLoader
    source: str | None = None  # data workload: how the files are read (data_workload.SOURCES)
    speedup: str | None = None  # the registry entry, for "alone" rows
    skip: str | None = None
    inverse: bool = False  # naive already has this tip; the row turns it off to price it
    script: str | None = None  # the entry's dedicated benchmark script, if any
    note: str = ""

    @property
    def measured(self) -> bool:
        return self.skip is None and self.plan is not None


def _hardware_reason(plan: Plan, hw: Hardware, first: Speedup) -> str | None:
    """Why this hardware cannot run ``plan`` as asked: ``first``'s own reason, else another active entry's."""
    for entry in [first, *(e for e in all_speedups() if e.name != first.name)]:
        if entry.active(plan):
            reason = entry.requires(hw, plan)
            if reason is not None:
                return f"{entry.name}: {reason}"
    return None


def _is_inverse(entry: Speedup, changes: dict[str, Any]) -> bool:
    """The bench entry turns off a tip that the naive plan (like plain PyTorch) already has."""
    return changes.get(entry.field) is False and getattr(Plan(), entry.field) is True


def _alone(entry: Speedup, workload: Workload, hw: Hardware, device: str, compile_ok: bool) -> Candidate:
    bench = entry.bench
    changes = dict(bench.changes)
    script_note = f"; measured by {bench.script}" if bench.script else ""
    cand = Candidate(
        label=entry.name,
        kind="alone",
        plan=None,
        speedup=entry.name,
        script=bench.script,
        path=LOADER if DATA_PATH_FIELDS & set(changes) else RESIDENT,
        inverse=_is_inverse(entry, changes),
    )
    if workload.name not in bench.workloads:
        cand.skip = f"benchmarked on {', '.join(bench.workloads)}, not {workload.name}{script_note}"
        return cand
    plan = Plan(device=device).replace(**changes)
    cand.plan = plan
    if cand.inverse:
        cand.label = f"{entry.name} off"
        cand.note = f"naive already has {entry.field}=True; this row turns it off, its speed-up is what the tip buys"
    if plan.compile is not False and not compile_ok:
        cand.skip = "compile rows are off for this run (--quick or --no-compile)"
    elif (reason := _hardware_reason(plan, hw, entry)) is not None:
        cand.skip = reason + script_note
    elif plan.batch_size is not None and plan.batch_size <= workload.batch_size:
        cand.skip = f"no larger batch: the {workload.name} workload already uses batch_size {workload.batch_size}"
    return cand


def _fast(model: nn.Module, device: str, compile_ok: bool) -> Candidate:
    fast = Plan.fast(model, device=device)
    label, extra = "fast", ""
    if fast.compile is not False and not compile_ok:
        fast, label = fast.replace(compile=False), "fast (no compile)"
        extra = "; compile left out (--quick or --no-compile)"
    return Candidate(label, "fast", fast, note=f"plan: {fast.describe()}{extra}")


def candidates(
    workload: Workload,
    model: nn.Module,
    hw: Hardware,
    device: str = "auto",
    compile_ok: bool = True,
    ablation: bool = True,
) -> list[Candidate]:
    """The rows for ``workload`` on ``hw``: naive, each registry entry alone, fast (not tuned).

    ``ablation=False`` leaves the entries alone unmeasured (listed with the reason): naive and fast only,
    on each path."""
    naive = Candidate("naive", "naive", Plan(device=device))
    alone = [_alone(entry, workload, hw, device, compile_ok) for entry in all_speedups()]
    fast_row = _fast(model, device, compile_ok)
    if workload.name == "data":
        return _data_candidates(naive, alone, fast_row)
    rows = [naive, *(c for c in alone if c.path == RESIDENT), fast_row]
    loader_rows = [c for c in alone if c.path == LOADER]
    data_path = any(c.measured for c in loader_rows)
    if not ablation:
        for cand in alone:
            if cand.measured:
                cand.skip = "the rows of each speed-up alone are off for this run (--no-ablation)"
    if data_path:
        rows += [
            dataclasses.replace(naive, label="naive (data path)", path=LOADER),
            *loader_rows,
            dataclasses.replace(fast_row, label=f"{fast_row.label} (data path)", path=LOADER),
        ]
    else:
        rows += loader_rows  # all skipped: listed for their reasons, no data-path baseline needed
    return rows


def _data_candidates(naive: Candidate, alone: list[Candidate], fast: Candidate) -> list[Candidate]:
    """The data workload's rows: every plan reads the files over HTTP, from a source of its own."""

    def option(label: str, source: str) -> Candidate:
        return dataclasses.replace(
            naive, label=label, kind="option", source=source, note=f"naive plan; {SOURCES[source]}"
        )

    for cand in alone:
        cand.source = PLAIN
    fast.source = CACHE
    fast.note += f"; {SOURCES[CACHE]}"
    return [
        dataclasses.replace(naive, source=PLAIN, note=f"{SOURCES[PLAIN]}, no workers"),
        option("tt.data.FileDataset (no cache)", FILES),
        option("tt.data.FileDataset + disk cache", CACHE),
        *alone,
        fast,
        option("local disk", LOCAL),
    ]


def _accepted(fn: Callable, options: dict[str, Any]) -> dict[str, Any]:
    """The ``options`` that ``fn`` takes (all of them when it takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return options
    return {k: v for k, v in options.items() if k in params}


def tuned_candidate(
    workload: Workload,
    model: nn.Module,
    device: str,
    budget_s: float,
    tune_fn: Callable | None = None,
    compile_ok: bool = True,
    loader: Any = None,
) -> Candidate:
    """The plan ``tt.tune`` finds for this workload (on ``loader``, default the workload's own),
    or a skip saying why there is none."""
    if tune_fn is None:
        try:
            from ..tuning import tune as default_tune  # written separately; the bench works without it
        except ImportError as exc:
            return Candidate("tuned", "tuned", None, skip=f"turbotrain.tuning is not available in this build ({exc})")
        tune_fn = default_tune
    # The bench prints its own table; a run without compile rows keeps compile out of the search too.
    options = {"verbose": False, **({} if compile_ok else {"exclude": ("compile",)})}
    try:
        plan = tune_fn(
            model,
            workload.loss_fn,
            loader if loader is not None else workload.loader(),
            workload.optimizer_fn,
            time_budget_s=budget_s,
            **_accepted(tune_fn, options),
        )
    except Exception as exc:  # noqa: BLE001 - a tuner failure is reported in its row, the bench goes on
        return Candidate("tuned", "tuned", None, skip=f"the tuner failed: {type(exc).__name__}: {exc}")
    if plan.device != device:
        plan = plan.replace(device=device)
    return Candidate("tuned", "tuned", plan, note=f"plan: {plan.describe()}; tuned within {budget_s:.0f} s")


def tuning_off() -> Candidate:
    """The tuned row of a run that does not tune: listed, with the reason."""
    return Candidate("tuned", "tuned", None, skip="tuning is off for this run (--quick or --no-tune)")


def insert_after_fast(cands: list[Candidate], tuned: Candidate) -> None:
    """The tuned row goes right after the fast row."""
    cands.insert(next(i for i, c in enumerate(cands) if c.kind == "fast") + 1, tuned)
