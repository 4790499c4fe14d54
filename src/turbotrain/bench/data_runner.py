"""The data workload's ablation: every plan trains two whole epochs over files served by nginx.

Each trial (``measure.run_epochs``) starts from a fresh loader over a fresh source (a new, empty
disk cache for the cache rows), warms the model up on a batch already in memory, then times
epoch 1 and epoch 2 from ``iter(loader)`` to the last step: worker start-up is inside the
epoch, which is what ``persistent_workers`` saves. Repeats are interleaved with the other plans
as for every workload, and each epoch gets its own rows, compared with the naive plan's same
epoch. Bytes read per URL scheme (``turbotrain.data.stats``) show where each epoch's data came
from: an epoch 2 read from the cache reads nothing from the server.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Callable

import torch

from ..hardware import Hardware
from ..measure import EpochTrial, Trial, run_epochs
from ..speedups.registry import get as get_speedup
from .ablation import Candidate, candidates, insert_after_fast, tuned_candidate, tuning_off
from .data_workload import CACHE, SOURCES, FilesWorkload, ServedFiles, ServerUnavailable, nginx_missing
from .interleave import Progress, run_interleaved
from .results import Row, WorkloadResult
from .rows import compare_rows, planned_row, summarise
from .settings import BenchSettings
from .stats import compare
from .workloads import get_workload

__all__ = ["run_data_workload", "EPOCHS"]

EPOCHS = 2


def run_data_workload(
    settings: BenchSettings,
    hw: Hardware,
    scale: str,
    progress: Progress = lambda msg: None,
    tune_fn: Callable | None = None,
) -> WorkloadResult:
    wl: FilesWorkload = get_workload(
        "data",
        scale,
        quick=settings.quick,  # type: ignore[assignment]  # "data": a FilesWorkload
        files=settings.data_files,
        latency_ms=settings.data_latency_ms,
    )
    model, _ = wl.build(settings.seed)
    cands = candidates(wl, model, hw, settings.device, compile_ok=settings.compile)
    result = WorkloadResult(
        "data",
        wl.unit,
        scale,
        wl.batch_size,
        sum(p.numel() for p in model.parameters()),
        None,
        rows=[],
        steps=wl.files // wl.batch_size,
        description=wl.describe(),
    )
    why = nginx_missing()
    if why is None:
        try:
            with tempfile.TemporaryDirectory(prefix="turbotrain-bench-data-") as tmp:
                progress(f"data: writing {wl.files} files and starting nginx")
                with ServedFiles(wl, Path(tmp), settings.seed) as served:
                    insert_after_fast(cands, _tuned(wl, model, served, Path(tmp), settings, progress, tune_fn))
                    result.rows = _measure(wl, model, cands, served, Path(tmp), settings, progress)
                    return result
        except ServerUnavailable as exc:
            why = str(exc)
    insert_after_fast(cands, Candidate("tuned", "tuned", None))
    result.skip = why
    result.rows = [planned_row(dataclasses.replace(c, skip=c.skip or why)) for c in cands]
    return result


def _tuned(
    wl: FilesWorkload,
    model: torch.nn.Module,
    served: ServedFiles,
    tmp: Path,
    settings: BenchSettings,
    progress: Progress,
    tune_fn: Callable | None,
) -> Candidate:
    if not settings.tune:
        return tuning_off()
    progress(f"data: tuning (budget {settings.tune_budget_s:.0f} s)")
    # The tuner sees the loader the fast row reads through, and the tuned row reads the same way.
    loader = served.loader(CACHE, tmp / "tune-cache", settings.seed)
    tuned = tuned_candidate(
        wl, model, settings.device, settings.tune_budget_s, tune_fn, settings.compile, loader=loader
    )
    shutil.rmtree(tmp / "tune-cache", ignore_errors=True)
    if tuned.measured:
        tuned.source = CACHE
        tuned.note += f"; {SOURCES[CACHE]}, as when tuning"
    return tuned


def _measure(
    wl: FilesWorkload,
    model: torch.nn.Module,
    cands: list[Candidate],
    served: ServedFiles,
    tmp: Path,
    settings: BenchSettings,
    progress: Progress,
) -> list[Row]:
    warm = list(itertools.islice(wl.loader(seed=settings.seed), 1))  # the same images, already in memory
    measured = [c for c in cands if c.measured]
    # One untimed batch per source first: this process's HTTP session, nginx and the page cache
    # start warm for every plan alike, not for all but the first one.
    for source in dict.fromkeys(c.source for c in measured):
        next(iter(served.loader(source, tmp / "pilot-cache", settings.seed)))  # type: ignore[arg-type]  # data rows have a source
    shutil.rmtree(tmp / "pilot-cache", ignore_errors=True)

    def run_one(rnd: int, k: int, cand: Candidate) -> EpochTrial:
        cache = tmp / f"cache-{rnd}-{k}" if cand.source == CACHE else None
        assert cand.source is not None and cand.plan is not None  # a measured row of the data workload
        trial = run_epochs(
            model,
            wl.optimizer_fn,
            wl.loss_fn,
            served.loader(cand.source, cache, settings.seed),
            cand.plan,
            epochs=EPOCHS,
            warmup=settings.warmup,
            warmup_batches=warm,
            seed=settings.seed,
        )
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)  # the next repeat's epoch 1 starts cold again
        return trial

    trials: dict[int, list[EpochTrial]] = run_interleaved("data", measured, settings.repeats, progress, run_one)
    by_epoch: list[list[Row]] = [[] for _ in range(EPOCHS)]
    unmeasured: list[Row] = []
    for cand in cands:
        done = trials.get(id(cand), [])
        if not done:
            unmeasured.append(planned_row(cand))
            continue
        for epoch in range(1, EPOCHS + 1):
            row = _epoch_row(cand, done, epoch, wl, settings)
            (by_epoch[epoch - 1] if row.measured else unmeasured).append(row)
            if not row.measured:
                break  # a failed plan is one error row, not one per epoch
    rows = [row for epoch_rows in by_epoch for row in epoch_rows]
    compare_rows(rows)
    _note_against_what_it_needs(rows)
    return rows + unmeasured


def _epoch_view(t: EpochTrial, epoch: int) -> Trial:
    """Epoch ``epoch`` of an epoch trial as a Trial whose one "step" is the epoch's mean step."""
    view = Trial(
        plan=t.plan,
        samples_per_step=0,
        error=t.error,
        applied=t.applied,
        skipped=t.skipped,
        peak_memory_bytes=t.peak_memory_bytes,
    )
    if t.ok:
        steps = t.epoch_steps[epoch - 1]
        view.samples_per_step = t.epoch_samples[epoch - 1] // steps
        view.step_times_s = [t.epoch_s[epoch - 1] / steps]  # so samples_per_s is the epoch's samples / its time
        view.losses = [loss for losses in t.epoch_losses[:epoch] for loss in losses]
    return view


def _epoch_row(
    cand: Candidate, trials: list[EpochTrial], epoch: int, wl: FilesWorkload, settings: BenchSettings
) -> Row:
    row = summarise(cand, [_epoch_view(t, epoch) for t in trials], wl, settings.warmup)
    if not row.measured:
        return row
    row.label, row.path = f"{cand.label} (epoch {epoch})", f"epoch {epoch}"
    row.read_bytes = dict(trials[0].reads[epoch - 1])
    if epoch == 1:
        # The warm-up steps ran on a batch in memory before epoch 1: what they took beyond the
        # fastest measured step is compile and allocator warm-up.
        extra = [max(0.0, t.warmup_s - settings.warmup * min(t.step_times_s)) for t in trials]
        row.warmup_cold_s = extra[0]
        row.warmup_warm_s = statistics.median(extra[1:]) if len(extra) > 1 else None
    else:
        row.warmup_cold_s = row.warmup_warm_s = None
        row.note = ""  # said once, on the epoch 1 row
    return row


def _note_against_what_it_needs(rows: list[Row]) -> None:
    """A registry row that needs another switch (persistent workers need workers) is also held against that row."""
    alone = [r for r in rows if r.kind == "alone" and r.measured]
    for row in alone:
        own = get_speedup(row.speedup_name).field  # type: ignore[arg-type]  # an "alone" row names its speed-up
        needs = {k: v for k, v in row.changes.items() if k != own}
        base = next((r for r in alone if r.path == row.path and needs and r.changes == needs), None)
        if base is None:
            continue
        cmp = compare(row.units_per_s_runs, base.units_per_s_runs)
        text = f"against {base.label}: {cmp.speedup:.2f}x ({cmp.verdict})"
        row.note = f"{row.note}; {text}" if row.note else text


def data_notes(results: list[WorkloadResult]) -> list[str]:
    """The run's notes about the data workload, when it ran."""
    data = next((w for w in results if w.name == "data" and not w.skip), None)
    if data is None:
        return []
    return [
        f"data: {data.description}; each trial trains {EPOCHS} epochs of {data.steps} steps from a fresh loader "
        "(and a fresh, empty cache) after warm-up steps on a batch in memory; an epoch is timed from "
        "iter(loader) to its last step, so worker start-up counts, and 'step' is its time over its steps; "
        "'bytes read' is the first repeat's reads per URL scheme (http: the server, cache: turbotrain's disk "
        "cache, file: local disk)"
    ]
