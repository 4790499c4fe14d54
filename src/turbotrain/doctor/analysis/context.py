"""Everything the rules look at, gathered once from a recording: one object, easy to fake in tests.

Rules never touch torch hooks or the recorder; they read a :class:`Context`. A test can take
the context of a real CPU run and ``replace(hw=<a CUDA Hardware>, device="cuda")`` to check
that a GPU-only rule fires where it should.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from torch import nn

from ...data.stats import ReadStats
from ...hardware import Hardware, detect, own_busy_cores
from ...measure import run_means
from ...speedups.model_info import ModelInfo, inspect_model
from .breakdown import Breakdown, Overhead, compute_breakdown
from .machine import MachineFacts, machine_facts, others_share
from ..findings import one_line
from ..record.recording import LiveObjects, Recording
from ..record.recording import Capture
from ..record.recurring import find_watched
from ..record.measurements import Category, EventCounts, ForwardFacts, LoaderRecord, StepRecord
from ..sites import Site
from .source import SourceIndex, load_sources

if TYPE_CHECKING:
    from ..record.cadence import PlannedLoop
    from ..record.compile_watch import CompileFacts
    from ..record.loss_capture import EagerLoss
    from .ranks import RankAnalysis
    from ..record.memory_watch import LossFn, StepMemory
    from .memory import FitMeasure
    from .gap_work import OccasionalWork
    from .periodic import PeriodicRow

__all__ = ["Context", "SiteStat", "build_context"]

log = logging.getLogger("turbotrain")


@dataclass(frozen=True)
class SiteStat:
    """One kind of event at one line, averaged over the measured steps."""

    kind: str
    site: Site
    per_step: float
    seconds_per_step: float
    bytes_per_step: float
    detail: dict


@dataclass
class Context:
    script: str | None
    base: str | None  # folder the report's file:line paths are relative to
    hw: Hardware
    device: str  # where the model trains: "cpu" or "cuda"
    breakdown: Breakdown
    measured_steps: list[int]
    tallies: dict[tuple[str, Site], EventCounts] = field(default_factory=dict)
    loaders: list[LoaderRecord] = field(default_factory=list)
    optimizers: list[tuple[Any, Site | None]] = field(default_factory=list)
    module_sites: dict[int, Site] = field(default_factory=dict)  # id(module) -> construction site
    model: nn.Module | None = None  # the outermost trained module
    modules: list[nn.Module] = field(default_factory=list)  # every outermost module called in a step
    info: ModelInfo = field(default_factory=ModelInfo)
    facts: ForwardFacts = field(default_factory=ForwardFacts)
    capture: Capture | None = None
    eval_grad_inputs: tuple[tuple, dict] | None = None  # (args, kwargs) of a validation forward with autograd on
    eager_loss: EagerLoss | None = None  # a loss on a compiled graph's output, computed outside the graph
    profile: dict[str, Any] = field(default_factory=dict)
    matmul_shapes: dict[Site, tuple] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    sources: dict[str, SourceIndex] = field(default_factory=dict)
    world_size: int = 1
    storage_stats: ReadStats | None = None  # reads through turbotrain.data over the measured steps (slow-storage)
    step_records: list[StepRecord] = field(default_factory=list)
    gap_samples: dict[Site, int] = field(default_factory=dict)  # user lines running untimed before the forward
    zero_grad_before_backward: bool = False  # the script clears gradients between its forward and backward
    # The user's lines in functions seen running (warm-up, profiler window), per file; None: untraced.
    ran_lines: dict[str, tuple[int, ...]] | None = None
    machine: MachineFacts | None = None  # cores, threads, workers, other load (doctor.machine); None: not known
    recording: Recording | None = None  # what this context was read from
    memory_allowed: bool = True  # False (--no-what-if): the step's memory is not measured (analysis/memory.py)
    memory_failed: str | None = None  # why one step of copies failed, where it did (set by step_memory)
    # The optimizer steps of the whole run where the script ended by itself; None: the doctor stopped it, or it failed.
    run_steps: int | None = None

    @property
    def noise_floor(self) -> float:
        """The least relative gain this window can tell from noise (:func:`.machine.noise_floor`)."""
        from .machine import noise_floor

        return noise_floor(self.machine) if self.machine is not None else 0.0

    def replace(self, **changes: Any) -> "Context":
        return dataclasses.replace(self, **changes)

    # -- analyses several rules read, each computed once -------------------------------------------

    @cached_property
    def periodic_rows(self) -> list[PeriodicRow]:
        """Each recurring piece of work, its amortised cost and a cadence under 5% (:func:`.periodic_table`)."""
        from .periodic import periodic_table  # it reads this context: imported late, no cycle

        return periodic_table(self)

    @cached_property
    def occasional_work(self) -> OccasionalWork | None:
        """Work the script ran before the forward in a few steps only (:func:`.gap_work.occasional_work`)."""
        from .gap_work import occasional_work

        return occasional_work(self)

    @cached_property
    def job(self) -> RankAnalysis | None:
        """Every rank side by side, on a job of two or more recorded ranks (else None)."""
        from .ranks import analyse_ranks

        recording = self.recording
        return analyse_ranks(recording.job) if recording is not None and len(recording.job) >= 2 else None

    @cached_property
    def step_memory(self) -> StepMemory | None:
        """One step of copies of the captured model measured for memory (:mod:`.memory`); None where nothing was
        captured, the run died of an out-of-memory error, measuring is off, an optimizer steps only with a closure
        (LBFGS: its step re-runs the script's own closure, which the copies cannot), or the step failed on copies."""
        from .memory import measure_captured

        recording = self.recording
        died = recording is not None and recording.out_of_memory is not None
        optimizers = [opt for opt, _ in self.optimizers]
        if self.capture is None or not self.memory_allowed or died or any(map(_steps_with_closure, optimizers)):
            return None
        try:
            return measure_captured(self.capture, optimizers, loss_fn=self.script_loss)
        except Exception as exc:  # noqa: BLE001 - a model the copies cannot train costs the memory section only
            self.memory_failed = one_line(exc)
            log.warning("turbotrain doctor: the step's memory was not measured: %s", self.memory_failed)
            return None

    @cached_property
    def fit_after_oom(self) -> FitMeasure | None:
        """After the run died of an out-of-memory error: the step at a batch that fits and the fixes measured there
        (:func:`.memory.fit_after_oom`); None otherwise, where measuring is off, or where a step of copies failed
        for another reason (``memory_failed`` says which)."""
        from .memory import fit_after_oom

        recording = self.recording
        oom = recording.out_of_memory if recording is not None else None
        if oom is None or self.capture is None or not self.memory_allowed:
            return None
        optimizers = [opt for opt, _ in self.optimizers]
        try:
            return fit_after_oom(self.capture, optimizers, oom, self.script_loss, autocasts=bool(self.facts.autocast))
        except Exception as exc:  # noqa: BLE001 - a model the copies cannot train costs the memory section only
            self.memory_failed = one_line(exc)
            log.warning("turbotrain doctor: the step's memory was not measured: %s", self.memory_failed)
            return None

    @property
    def script_loss(self) -> LossFn:
        """The re-runs' loss (:func:`.replay.surrogate_step`) with the forward under the script's autocast."""
        from .replay import script_loss

        return script_loss(self.facts, self.on_gpu)

    @property
    def compiled(self) -> CompileFacts | None:
        """What torch.compile did in the run, where the script compiled (:mod:`..record.compile_watch`)."""
        return self.recording.compiled if self.recording is not None else None

    # -- conveniences for rules --------------------------------------------------------------------

    @property
    def planned_steps(self) -> tuple[int, PlannedLoop] | None:
        """The optimizer steps the script's loop runs in all, where its length was read (a ``for`` over ``range()``,
        a ``while`` a counter ends, a framework trainer's steps: record/cadence.py) and its counter moved a whole
        number of iterations a step over the window, with that loop; None otherwise."""
        readings = self.recording.planned_loop if self.recording is not None else ()
        if len(readings) < 2:
            return None
        (start, first), (end, last) = readings[0], readings[-1]
        if first.site != last.site or first.counter is None or last.counter is None or end <= start:
            return None
        per_step = (last.counter - first.counter) / first.by / (end - start)  # iterations a step
        if per_step < 1 or per_step != int(per_step):
            return None
        if not first.left:
            return int(first.iterations // per_step), first
        # A while: the steps done at each reading (the current one counted) and those its iterations left make.
        totals = {done - 1 + -(-loop.iterations // int(per_step)) for done, loop in (readings[0], readings[-1])}
        return (totals.pop(), first) if len(totals) == 1 else None  # two: its bound moved

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def step_s(self) -> float:
        """The script's own mean step: time other processes took is out, periodic work spread over its period
        (what shares of "the step" are shares of; the breakdown's seconds add up to it)."""
        return sum(self.breakdown.seconds.values()) or self.breakdown.mean_s

    def share(self, category: Category) -> float:
        return self.breakdown.shares.get(category, 0.0)

    def timed_share(self, category: Category) -> float:
        """The share a phase took as timed, stalls from other processes included."""
        return self.breakdown.raw_shares.get(category, self.share(category))

    def dispatch_share(self) -> float:
        """Share of step time that is per-op dispatch and interpreter overhead, in whichever phase."""
        return self.breakdown.dispatch_share

    def seconds(self, category: Category) -> float:
        return self.breakdown.seconds.get(category, 0.0)

    def site_stats(self, kind_prefix: str) -> list[SiteStat]:
        """Events whose kind starts with ``kind_prefix``, per site, over the measured steps, busiest first."""
        steps = self.measured_steps
        out = []
        for (kind, site), tally in self.tallies.items():
            if not kind.startswith(kind_prefix):
                continue
            count, seconds, nbytes = tally.per_step(steps)
            out.append(SiteStat(kind, site, count, seconds, nbytes, tally.detail))
        return sorted(out, key=lambda s: (-s.seconds_per_step, -s.per_step))

    def ran_sites(self, kind_prefix: str) -> list[SiteStat]:
        """:meth:`site_stats` of the sites whose events ran during the measured steps."""
        return [s for s in self.site_stats(kind_prefix) if s.per_step > 0]

    def stat_at(self, kind_prefix: str, site: Site) -> SiteStat | None:
        """The :meth:`site_stats` entry at ``site``'s line (file and line; the function name may differ)."""
        return next(
            (s for s in self.site_stats(kind_prefix) if s.site.file == site.file and s.site.line == site.line), None
        )

    def seen(self, kind_prefix: str) -> list[tuple[str, Site, EventCounts]]:
        """Events of a kind at any time of the run (warm-up and profiling included)."""
        return [(kind, site, t) for (kind, site), t in self.tallies.items() if kind.startswith(kind_prefix)]

    def where(self, site: Site | None) -> str | None:
        return site.where(self.base) if site else None

    def module_site(self, module: nn.Module | None) -> Site | None:
        return self.module_sites.get(id(module)) if module is not None else None

    @property
    def main_loader(self) -> LoaderRecord | None:
        """The DataLoader the measured steps waited on the most."""
        best, best_key = None, (-1, -1.0)
        for record in self.loaders:
            count, seconds, _ = record.nexts.total(self.measured_steps)
            if (count, seconds) > best_key:
                best, best_key = record, (count, seconds)
        return best if best_key[0] > 0 else None

    def backwards_per_step(self) -> float:
        """Backward passes per measured step (more than one: gradient accumulation, or a second loss)."""
        measured = set(self.measured_steps)
        chosen = [s for s in self.step_records if s.index in measured]
        return sum(s.backwards for s in chosen) / len(chosen) if chosen else 0.0

    def function_ran(self, site: Site | None) -> bool | None:
        """Whether the function holding ``site``'s line was seen running (during warm-up or the profiler
        window, or with an event recorded at that very line); None when the run could not tell."""
        if site is None or self.ran_lines is None:
            return None
        if any(seen.file == site.file and seen.line == site.line for _, seen in self.tallies):
            return True
        if site.line in self.ran_lines.get(site.file, ()):
            return True
        return False if self.ran_lines else None

    @property
    def written_for_gpu(self) -> bool:
        return any(src.mentions_cuda for src in self.sources.values())


def _user_files(script: str | None, tallies: dict, module_sites: dict) -> list[str]:
    files = {script} if script else set()
    base = os.path.dirname(script) if script else None
    for _, site in tallies:
        files.add(site.file)
    for site in module_sites.values():
        files.add(site.file)
    # Only files next to the script (the user's own package), not someone else's code.
    return sorted(f for f in files if f and (base is None or f.startswith(base)))


def unwrapped(capture: Capture | None) -> Capture | None:
    """The capture with DDP / DataParallel taken off: trials time the model, not the wrapper's collectives."""
    if capture is None:
        return None
    module = capture.module
    while isinstance(module, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        module = module.module
    if module is capture.module:
        return capture
    return dataclasses.replace(capture, module=module)


def measure_overhead(
    capture: Capture | None,
    optimizers: list[Any],
    raw: Breakdown,
    prof: dict[str, float],
    module_calls: float,
    device: str,
) -> Overhead:
    """The python_overhead model of this run (see :mod:`turbotrain.doctor.analysis.overhead`)."""
    from .overhead import counted_overhead, dispatch_floor, optimizer_overhead_s

    if not raw.steps:
        return Overhead()
    try:
        counted = counted_overhead(capture) if capture is not None else None
    except Exception:  # noqa: BLE001 - a model that cannot be copied or re-run: use the estimate
        counted = None
    if counted is not None:
        return Overhead(
            method="counted",
            compute_share=counted["share"],
            optimizer_s=optimizer_overhead_s(optimizers, raw.seconds["optimizer"], device),
            detail={k: round(v, 4) for k, v in counted.items()},
        )
    ops = prof.get("ops_per_step", 0.0)
    if not ops and not module_calls:
        return Overhead()
    op_floor, module_floor = dispatch_floor()
    return Overhead(
        method="estimated",
        estimate_s=ops * op_floor + module_calls * module_floor,
        detail={
            "ops_per_step": ops,
            "module_calls_per_step": module_calls,
            "op_floor_us": round(op_floor * 1e6, 3),
            "module_floor_us": round(module_floor * 1e6, 3),
        },
    )


def _ordinary_steps(breakdown: Breakdown, loaders: list[LoaderRecord]) -> list[float]:
    """Step times without the steps holding periodic work (validation every N steps is the script, not noise);
    where DataLoader workers build the batches, the means of runs of ``num_workers`` steps
    (:func:`turbotrain.measure.run_means`): the spread of the workers' rounds is the script's own, what other
    processes do still spreads the runs."""
    periodic = {i for p in breakdown.periodic for i in p.steps}
    ordinary = [t for i, t in zip(breakdown.steps, breakdown.step_seconds) if i not in periodic]
    return run_means(ordinary, min(loader_round(loaders, breakdown.steps), len(ordinary) // 5))


def loader_round(loaders: list[LoaderRecord], steps: list[int]) -> int:
    """The most DataLoader workers of a loader that fed ``steps``: how many steps one round of theirs feeds."""
    wanted = set(steps)
    return max((r.settings.get("num_workers") or 0 for r in loaders if r.nexts.total(wanted)[0]), default=0)


def _siblings_load(recording: Recording) -> float:
    """Cores the job's other ranks on this host kept busy over their measured steps."""
    busy = [
        own_busy_cores(r.load_start, r.load_end)
        for r in recording.job
        if r.rank != recording.rank and r.host == recording.host
    ]
    return sum(b for b in busy if b is not None)


def build_context(
    recording: Recording, live: LiveObjects | None = None, script: str | None = None, device: str | None = None
) -> Context:
    """The rules' view of a finished recording (and, in the process that recorded it, its live objects)."""
    live = live or LiveObjects()
    window = recording.window
    facts = recording.facts or ForwardFacts()
    device = device or facts.device or "cpu"
    optimizers = list(zip(live.optimizers, recording.optimizer_sites))
    # Device time per phase only means something when the model trains on the GPU.
    gpu_phases = recording.gpu_phase_seconds()
    gpu_seconds = gpu_phases if device == "cuda" and gpu_phases else None
    load = (recording.load_start, recording.load_end)
    their_share = others_share(load)  # of the run-queue wait: the rest is the script's own workers
    steps = list(recording.steps)
    prof = dict(recording.profile)
    capture = unwrapped(live.capture)
    raw = compute_breakdown(steps, window.warmup, None, gpu_seconds, their_share)
    overhead = measure_overhead(capture, live.optimizers, raw, prof, recording.module_calls_per_step, device)
    breakdown = compute_breakdown(
        steps, window.warmup, overhead, gpu_seconds, their_share, find_watched(recording.watched, steps)
    )
    model = capture.module if capture is not None else live.trained
    module_sites = {m.module_id: m.site for m in recording.module_sites}
    tallies = {(e.kind, e.site): e for e in recording.events if e.site is not None}
    loaders = [dataclasses.replace(r, loader=live.loaders.get(r.key)) for r in recording.loaders]
    try:
        info = inspect_model(model)
    except Exception:  # noqa: BLE001 - a model inspect_model cannot read gets no structural rules, not an error
        info = ModelInfo()
    script = os.path.realpath(script) if script else None
    hw = detect(device if device in ("cpu", "cuda") else "auto")
    return Context(
        script=script,
        base=os.path.dirname(script) if script else None,
        hw=hw,
        device=device,
        breakdown=breakdown,
        measured_steps=breakdown.steps,
        tallies=tallies,
        loaders=loaders,
        optimizers=optimizers,
        module_sites=module_sites,
        model=model,
        modules=list(live.modules),
        info=info,
        facts=facts,
        capture=capture,
        eval_grad_inputs=live.eval_grad_inputs,
        eager_loss=live.eager_loss,
        profile=prof,
        matmul_shapes={m.site: (m.a, m.b) for m in recording.matmul_shapes},
        env=dict(os.environ),
        sources=load_sources(_user_files(script, tallies, module_sites)),
        world_size=recording.world_size,
        step_records=steps,
        gap_samples={g.site: g.count for g in recording.gap_samples},
        zero_grad_before_backward=recording.zero_grad_before_backward > recording.zero_grad_elsewhere,
        storage_stats=recording.reads,
        ran_lines=recording.ran_lines,
        machine=machine_facts(
            hw,
            _ordinary_steps(breakdown, loaders),
            breakdown.interference_s / breakdown.mean_s if breakdown.mean_s else 0.0,
            loaders,
            load,
            recording.threads_seen,
            _siblings_load(recording),
        ),
        recording=recording,
    )


def _steps_with_closure(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` needs a closure (LBFGS), which re-runs the script's forward itself."""
    closure = inspect.signature(type(optimizer).step).parameters.get("closure")
    return closure is not None and closure.default is inspect.Parameter.empty
