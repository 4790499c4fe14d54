"""The ablation runner: measure every candidate plan of every workload with ``run_trial``.

Repeats are interleaved (round r of every plan before round r+1 of any) so that a slow
patch of a shared machine hits all plans alike. Every trial trains a fresh copy of the same
model from the same seed; compiled plans start from a reset ``torch.compiler`` each time,
inside an Inductor cache that was empty when the run began, so the first repeat's compile
is cold and the later ones are warm (the on-disk cache a re-run of a script would find).
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import math
import os
import platform
from dataclasses import asdict
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ..hardware import Hardware, detect
from ..measure import Trial, run_trial
from .ablation import LOADER, Candidate, candidates, insert_after_fast, tuned_candidate, tuning_off
from .anchors import compare_to_anchors
from .data_runner import data_notes, run_data_workload
from .interleave import Progress, run_interleaved
from .peaks import mfu, peak_bf16_flops
from .results import BenchResult, Row, WorkloadResult
from .rows import compare_rows, summarise
from .settings import BenchSettings
from .workload import Workload
from .workloads import get_workload

# The settings and results are defined in their own modules; importable from here as they always were.
__all__ = ["BenchSettings", "Row", "WorkloadResult", "BenchResult", "run_bench", "run_workload"]


def machine_info(hw: Hardware) -> dict[str, Any]:
    return {
        "device": hw.device_name,
        "device_type": hw.device_type,
        "summary": hw.summary(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores": hw.cpu_cores,
        "torch_threads": torch.get_num_threads(),
        "load_average": _load_average(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _load_average() -> float | None:
    """The 1-minute load average: how much else the machine was doing (timings on a busy one are noisy)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` intra-op threads (None: leave torch's setting), restored after."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def fresh_compile_cache() -> Iterator[None]:
    """An empty Inductor/Triton cache for the run (so the first compile is cold), removed after."""
    try:
        from torch._inductor.utils import fresh_cache  # private, but the one way torch offers
    except ImportError:  # pragma: no cover - older torch
        try:
            from torch._inductor.utils import fresh_inductor_cache as fresh_cache
        except ImportError:
            fresh_cache = contextlib.nullcontext  # type: ignore[assignment]  # no cache to empty
    torch.compiler.reset()
    try:
        with fresh_cache():
            yield
    finally:
        torch.compiler.reset()  # compiled code from the removed cache must not be reused


def _resident_batches(wl: Workload, batch_size: int, count: int, seed: int) -> list[Any]:
    return list(itertools.islice(wl.loader(batch_size=batch_size, seed=seed), count))


def _trial(
    wl: Workload,
    model: nn.Module,
    cand: Candidate,
    settings: BenchSettings,
    steps: int,
    batches: Callable[[int], list[Any]],
    loader: Callable[[], Any],
) -> Trial:
    plan = cand.plan
    assert plan is not None
    if cand.path == LOADER:
        return run_trial(
            model, wl.optimizer_fn, wl.loss_fn, [], plan, steps, settings.warmup, seed=settings.seed, loader=loader()
        )
    size = plan.batch_size or wl.batch_size
    resident = batches(size)
    if not resident:
        return Trial(plan, 0, error=f"ValueError: batch_size {size} is larger than the {wl.name} workload's data")
    return run_trial(model, wl.optimizer_fn, wl.loss_fn, resident, plan, steps, settings.warmup, seed=settings.seed)


def _calibrated_steps(
    wl: Workload, model: nn.Module, naive: Candidate, settings: BenchSettings, batches: Callable[[int], list[Any]]
) -> int:
    """Enough steps for a naive trial to last ``min_trial_s``: tiny steps need many to time well."""
    pilot = _trial(wl, model, naive, settings, settings.steps, batches, lambda: None)
    if not pilot.ok:
        return settings.steps
    wanted = math.ceil(settings.min_trial_s / max(pilot.step_s, 1e-9))
    return max(settings.steps, min(settings.max_steps, wanted))


def run_workload(
    name: str,
    settings: BenchSettings,
    hw: Hardware,
    progress: Progress = lambda msg: None,
    tune_fn: Callable | None = None,
) -> WorkloadResult:
    scale = settings.scale if settings.scale != "auto" else ("gpu" if hw.is_cuda else "cpu")
    if name == "data":
        return run_data_workload(settings, hw, scale, progress, tune_fn)
    options = {"tokens": settings.gpt_tokens} if name == "gpt" else {}
    wl = get_workload(name, scale, **options)
    model, _ = wl.build(settings.seed)
    cands = candidates(wl, model, hw, settings.device, compile_ok=settings.compile, ablation=settings.ablation)
    if settings.tune:
        progress(f"{name}: tuning (budget {settings.tune_budget_s:.0f} s)")
        tuned = tuned_candidate(wl, model, settings.device, settings.tune_budget_s, tune_fn, settings.compile)
    else:
        tuned = tuning_off()
    insert_after_fast(cands, tuned)

    batch_cache: dict[int, list[Any]] = {}

    def batches(size: int) -> list[Any]:
        if size not in batch_cache:
            batch_cache[size] = _resident_batches(wl, size, settings.batches, settings.seed)
        return batch_cache[size]

    loader_cache: list[Any] = []

    def loader() -> Any:
        if not loader_cache:
            loader_cache.append(wl.loader(seed=settings.seed))
        return loader_cache[0]

    measured = [c for c in cands if c.measured]
    progress(f"{name}: timing the naive plan to choose the number of steps")
    steps = _calibrated_steps(wl, model, cands[0], settings, batches)
    trials = run_interleaved(
        name,
        measured,
        settings.repeats,
        progress,
        lambda rnd, k, cand: _trial(wl, model, cand, settings, steps, batches, loader),
    )
    rows = [summarise(c, trials.get(id(c), []), wl, settings.warmup) for c in cands]
    compare_rows(rows)

    flops = model.flops_per_token() if hasattr(model, "flops_per_token") else None  # type: ignore[operator]  # hasattr
    if hw.is_cuda and flops is not None:
        peak = settings.peak_tflops * 1e12 if settings.peak_tflops else peak_bf16_flops(hw.device_name)
        for row in rows:
            if row.measured:
                row.mfu = mfu(row.units_per_s, flops, peak)  # type: ignore[arg-type]  # measured: it has one
    return WorkloadResult(
        name, wl.unit, scale, wl.batch_size, sum(p.numel() for p in model.parameters()), flops, rows, steps=steps
    )


def run_bench(
    settings: BenchSettings | None = None, progress: Progress = lambda msg: None, tune_fn: Callable | None = None
) -> BenchResult:
    """Measure every workload in ``settings``; see ``docs/bench.md`` for what each column means."""
    settings = settings or BenchSettings()
    hw = detect(settings.device)
    steps = (
        ""
        if settings.workloads == ("data",)
        # the data workload's trials are whole epochs (its own note)
        else f"each trial: {settings.warmup} warm-up steps, then at least {settings.steps} measured steps (more when "
        f"the naive plan would take under {settings.min_trial_s:g} s); "
    )
    notes = [
        f"{steps}{settings.repeats} interleaved repeats per plan; a speed-up is called only when it exceeds the "
        "spread of the repeats"
    ]
    if settings.quick:
        notes.append("--quick: compile rows and the tuned plan are skipped, trials are short")
    if not hw.is_cuda:
        notes.append("peak memory on CPU is the process's peak resident set (VmHWM), not the model's alone")
    cm = fresh_compile_cache() if settings.compile else contextlib.nullcontext()
    with torch_threads(settings.threads), cm:
        machine = machine_info(hw)
        results = [run_workload(name, settings, hw, progress, tune_fn) for name in settings.workloads]
    machine["load_average_end"] = _load_average()
    if machine["load_average"] and machine["load_average"] > 0.75 * hw.cpu_cores:
        notes.append(
            f"the machine was busy with other work (load average {machine['load_average']} at the start, "
            f"{machine['load_average_end']} at the end, on {hw.cpu_cores} cores): expect wide spreads"
            + ("; --threads 1 keeps CPU timings steadier" if not hw.is_cuda and settings.threads != 1 else "")
        )
    if "data" in settings.workloads:
        notes += data_notes(results)
    if any(r.path == LOADER and r.measured for w in results for r in w.rows):
        notes.append(
            "'data path' rows fetch every batch through the DataLoader and copy it to the device; "
            "the other rows train on batches already on the device"
        )
    result = BenchResult(machine, asdict(settings), notes, results)
    result.notes += [f"anchor: {line}" for line in compare_to_anchors(result)]
    return result
