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
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ..hardware import Hardware, detect
from ..measure import Trial, run_trial
from ..plan import Plan
from .ablation import LOADER, Candidate, candidates, tuned_candidate
from .anchors import compare_to_anchors
from .peaks import mfu, peak_bf16_flops
from .stats import compare, relative_spread
from .workloads import WORKLOADS, Workload, get_workload

__all__ = ["BenchSettings", "Row", "WorkloadResult", "BenchResult", "run_bench", "run_workload"]

Progress = Callable[[str], None]


@dataclass
class BenchSettings:
    workloads: tuple[str, ...] = tuple(WORKLOADS)
    steps: int = 20                  # measured steps per trial, at least (see min_trial_s)
    min_trial_s: float = 1.0         # more steps when the naive plan would measure less than this
    max_steps: int = 2000
    warmup: int = 3                  # steps before them: compile, autotune, allocator warm-up
    repeats: int = 3                 # interleaved rounds; median and spread come from them
    batches: int = 4                 # distinct batches cycled by resident-path trials
    compile: bool = True             # measure plans that use torch.compile
    tune: bool = True                # add the tuned plan when turbotrain.tune is installed
    tune_budget_s: float = 60.0
    scale: str = "auto"              # "cpu", "gpu" (GPT-2 small, ResNet-50), "auto": gpu when on CUDA
    device: str = "auto"
    seed: int = 0
    quick: bool = False
    gpt_tokens: str = "bytes"        # "bytes" (loss falls) or "random" (GPT-2 vocabulary, uniform tokens)
    peak_tflops: float | None = None  # dense bf16 peak of the device when it is not in bench.peaks
    threads: int | None = None       # torch intra-op threads for the run (None: torch's default)
    data_files: int | None = None    # data workload: files to serve (None: 256, --quick 96)
    data_latency_ms: float | None = None  # data workload: nginx's wait before each first byte (None: 20, --quick 5)

    @classmethod
    def quick_run(cls, **overrides: Any) -> "BenchSettings":
        """A run that ends in minutes on a small CPU: no compile rows, no tuning, short trials."""
        return cls(**{"steps": 6, "min_trial_s": 0.2, "max_steps": 300, "warmup": 1, "repeats": 3, "compile": False, "tune": False,
                      "quick": True, **overrides})

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 1 or self.repeats < 1 or self.batches < 1:
            raise ValueError("steps, warmup, repeats and batches must all be >= 1")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.min_trial_s < 0:
            raise ValueError(f"min_trial_s must be >= 0, got {self.min_trial_s}")
        if (self.data_files is not None and self.data_files < 1) or (self.data_latency_ms or 0) < 0:
            raise ValueError(f"data_files must be >= 1 and data_latency_ms >= 0, got {self.data_files} and "
                             f"{self.data_latency_ms}")
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown:
            raise ValueError(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")


@dataclass
class Row:
    """One measured (or skipped) plan of one workload."""

    label: str
    kind: str
    path: str
    speedup_name: str | None
    changes: dict[str, Any]
    skip: str | None = None
    error: str | None = None
    note: str = ""
    inverse: bool = False
    baseline: str | None = None                   # the row the speed-up is against
    samples_per_step: int | None = None           # per optimizer step (micro-batches x batch size)
    units_per_s: float | None = None              # median over repeats
    units_per_s_runs: list[float] = field(default_factory=list)
    step_s: float | None = None                   # median over repeats of each repeat's median step
    spread: float | None = None                   # relative (max - min) / median of units_per_s_runs
    speedup: float | None = None
    noise: float | None = None
    verdict: str | None = None
    warmup_cold_s: float | None = None            # warm-up beyond steady state, first repeat (compile: cold)
    warmup_warm_s: float | None = None            # the same, median of later repeats (compile: warm cache)
    peak_memory_bytes: int | None = None
    first_loss: float | None = None
    final_loss: float | None = None
    learning: bool | None = None                  # the loss fell over the trial and stayed finite
    mfu: float | None = None
    read_bytes: dict[str, int] = field(default_factory=dict)  # data workload: bytes per URL scheme (first repeat)
    applied: list[str] = field(default_factory=list)
    plan_skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return self.skip is None and self.error is None and self.units_per_s is not None


@dataclass
class WorkloadResult:
    name: str
    unit: str
    scale: str
    batch_size: int
    params: int
    flops_per_token: float | None
    rows: list[Row]
    steps: int = 0                                # measured steps per trial (after calibration; data: per epoch)
    description: str = ""                         # what the workload's data is, when the title does not say
    skip: str | None = None                       # why the workload could not run at all; its rows are skips


@dataclass
class BenchResult:
    machine: dict[str, Any]
    settings: dict[str, Any]
    notes: list[str]
    workloads: list[WorkloadResult]

    def to_dict(self) -> dict[str, Any]:
        return {"turbotrain_bench": 1, **asdict(self)}

    @property
    def errors(self) -> list[str]:
        return [f"{w.name}/{r.label}: {r.error}" for w in self.workloads for r in w.rows if r.error]


def machine_info(hw: Hardware) -> dict[str, Any]:
    return {
        "device": hw.device_name, "device_type": hw.device_type, "summary": hw.summary(),
        "cpu": platform.processor() or platform.machine(), "cpu_cores": hw.cpu_cores,
        "torch_threads": torch.get_num_threads(), "load_average": _load_average(),
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
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
            fresh_cache = contextlib.nullcontext
    torch.compiler.reset()
    try:
        with fresh_cache():
            yield
    finally:
        torch.compiler.reset()  # compiled code from the removed cache must not be reused


def _resident_batches(wl: Workload, batch_size: int, count: int, seed: int) -> list[Any]:
    return list(itertools.islice(wl.loader(batch_size=batch_size, seed=seed), count))


def _trial(wl: Workload, model: nn.Module, cand: Candidate, settings: BenchSettings, steps: int,
           batches: Callable[[int], list[Any]], loader: Callable[[], Any]) -> Trial:
    plan = cand.plan
    assert plan is not None
    if cand.path == LOADER:
        return run_trial(model, wl.optimizer_fn, wl.loss_fn, [], plan, steps, settings.warmup,
                         seed=settings.seed, loader=loader())
    size = plan.batch_size or wl.batch_size
    resident = batches(size)
    if not resident:
        return Trial(plan, 0, error=f"ValueError: batch_size {size} is larger than the {wl.name} workload's data")
    return run_trial(model, wl.optimizer_fn, wl.loss_fn, resident, plan, steps, settings.warmup, seed=settings.seed)


def _calibrated_steps(wl: Workload, model: nn.Module, naive: Candidate, settings: BenchSettings,
                      batches: Callable[[int], list[Any]]) -> int:
    """Enough steps for a naive trial to last ``min_trial_s``: tiny steps need many to time well."""
    pilot = _trial(wl, model, naive, settings, settings.steps, batches, lambda: None)
    if not pilot.ok:
        return settings.steps
    wanted = math.ceil(settings.min_trial_s / max(pilot.step_s, 1e-9))
    return max(settings.steps, min(settings.max_steps, wanted))


def _tuning_off() -> Candidate:
    return Candidate("tuned", "tuned", None, skip="tuning is off for this run (--quick or --no-tune)")


def _insert_after_fast(cands: list[Candidate], tuned: Candidate) -> None:
    """The tuned row goes right after the fast row."""
    cands.insert(next(i for i, c in enumerate(cands) if c.kind == "fast") + 1, tuned)


def _interleaved(name: str, measured: list[Candidate], repeats: int, progress: Progress,
                 run_one: Callable[[int, int, Candidate], Any]) -> dict[int, list[Any]]:
    """``run_one(round, index, cand)`` for round r of every plan before round r+1 of any; trials by ``id(cand)``."""
    trials: dict[int, list[Any]] = {id(c): [] for c in measured}
    for rnd in range(repeats):
        for k, cand in enumerate(measured):
            done = trials[id(cand)]
            if done and not done[-1].ok:
                continue  # a plan that failed once is reported, not retried
            progress(f"{name}: round {rnd + 1}/{repeats}, {cand.label}")
            if cand.plan.compile is not False:
                torch.compiler.reset()  # each repeat compiles again: cold the first time, then from the disk cache
            done.append(run_one(rnd, k, cand))
    return trials


def _row_of(cand: Candidate) -> Row:
    """The row as planned, before any measurement (all a skipped candidate gets)."""
    return Row(label=cand.label, kind=cand.kind, path=cand.path, speedup_name=cand.speedup,
               changes=cand.plan.changes(base=Plan(device=cand.plan.device)) if cand.plan else {},
               skip=cand.skip, note=cand.note, inverse=cand.inverse)


def _summarise(cand: Candidate, trials: list[Trial], wl: Workload, settings: BenchSettings) -> Row:
    row = _row_of(cand)
    if not trials:
        return row
    first = trials[0]
    row.applied, row.plan_skipped = first.applied, [tuple(s) for s in first.skipped]
    failed = next((t for t in trials if not t.ok), None)
    if failed is not None:
        error = failed.error or "no steps were measured"
        if cand.script and error.startswith("ConfigError"):
            # The plan cannot run in one process (e.g. DDP); its entry names the script that measures it.
            row.skip = f"{error.split('. ')[0]}; measured by {cand.script}"
        else:
            row.error = error
        return row
    row.samples_per_step = first.samples_per_step
    row.units_per_s_runs = [t.samples_per_s * wl.units_per_sample for t in trials]
    row.units_per_s = statistics.median(row.units_per_s_runs)
    row.step_s = statistics.median(t.step_s for t in trials)
    row.spread = relative_spread(row.units_per_s_runs)
    overhead = [max(0.0, t.warmup_s - settings.warmup * t.step_s) for t in trials]
    row.warmup_cold_s = overhead[0]
    row.warmup_warm_s = statistics.median(overhead[1:]) if len(overhead) > 1 else None
    peaks = [t.peak_memory_bytes for t in trials if t.peak_memory_bytes is not None]
    row.peak_memory_bytes = max(peaks) if peaks else None
    row.first_loss, row.final_loss = first.losses[0], first.final_loss
    row.learning = math.isfinite(row.final_loss) and row.final_loss < row.first_loss
    return row


def _compare_rows(rows: list[Row]) -> None:
    """Speed-up of each row against the naive row on the same path."""
    baselines = {r.path: r for r in rows if r.kind == "naive"}
    for row in rows:
        base = baselines.get(row.path)
        if base is None or not row.measured:
            continue
        row.baseline = base.label
        if row is base:
            row.speedup, row.noise, row.verdict = 1.0, row.spread, "baseline"
            continue
        if not base.measured:
            continue
        # An inverse row turns a tip off: what the tip buys is naive against the row.
        cand, ref = (base, row) if row.inverse else (row, base)
        cmp = compare(cand.units_per_s_runs, ref.units_per_s_runs)
        row.speedup, row.noise, row.verdict = cmp.speedup, cmp.noise, cmp.verdict


def run_workload(name: str, settings: BenchSettings, hw: Hardware, progress: Progress = lambda msg: None,
                 tune_fn: Callable | None = None) -> WorkloadResult:
    scale = settings.scale if settings.scale != "auto" else ("gpu" if hw.is_cuda else "cpu")
    if name == "data":
        from .data_runner import run_data_workload  # it builds on this module's rows

        return run_data_workload(settings, hw, scale, progress, tune_fn)
    options = {"tokens": settings.gpt_tokens} if name == "gpt" else {}
    wl = get_workload(name, scale, **options)
    model, _ = wl.build(settings.seed)
    cands = candidates(wl, model, hw, settings.device, compile_ok=settings.compile)
    if settings.tune:
        progress(f"{name}: tuning (budget {settings.tune_budget_s:.0f} s)")
        tuned = tuned_candidate(wl, model, settings.device, settings.tune_budget_s, tune_fn, settings.compile)
    else:
        tuned = _tuning_off()
    _insert_after_fast(cands, tuned)

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
    trials = _interleaved(name, measured, settings.repeats, progress,
                          lambda rnd, k, cand: _trial(wl, model, cand, settings, steps, batches, loader))
    rows = [_summarise(c, trials.get(id(c), []), wl, settings) for c in cands]
    _compare_rows(rows)

    flops = model.flops_per_token() if hasattr(model, "flops_per_token") else None
    if hw.is_cuda and flops is not None:
        peak = settings.peak_tflops * 1e12 if settings.peak_tflops else peak_bf16_flops(hw.device_name)
        for row in rows:
            if row.measured:
                row.mfu = mfu(row.units_per_s, flops, peak)
    return WorkloadResult(name, wl.unit, scale, wl.batch_size, sum(p.numel() for p in model.parameters()),
                          flops, rows, steps=steps)


def run_bench(settings: BenchSettings | None = None, progress: Progress = lambda msg: None,
              tune_fn: Callable | None = None) -> BenchResult:
    """Measure every workload in ``settings``; see ``docs/bench.md`` for what each column means."""
    settings = settings or BenchSettings()
    hw = detect(settings.device)
    steps = ("" if settings.workloads == ("data",) else  # the data workload's trials are whole epochs (its own note)
             f"each trial: {settings.warmup} warm-up steps, then at least {settings.steps} measured steps (more when "
             f"the naive plan would take under {settings.min_trial_s:g} s); ")
    notes = [f"{steps}{settings.repeats} interleaved repeats per plan; a speed-up is called only when it exceeds the "
             "spread of the repeats"]
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
        notes.append(f"the machine was busy with other work (load average {machine['load_average']} at the start, "
                     f"{machine['load_average_end']} at the end, on {hw.cpu_cores} cores): expect wide spreads"
                     + ("; --threads 1 keeps CPU timings steadier" if not hw.is_cuda and settings.threads != 1 else ""))
    if "data" in settings.workloads:
        from .data_runner import data_notes  # it builds on this module's rows

        notes += data_notes(results)
    if any(r.path == LOADER and r.measured for w in results for r in w.rows):
        notes.append("'data path' rows fetch every batch through the DataLoader and copy it to the device; "
                     "the other rows train on batches already on the device")
    result = BenchResult(machine, asdict(settings), notes, results)
    result.notes += [f"anchor: {line}" for line in compare_to_anchors(result)]
    return result

