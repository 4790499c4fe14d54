"""Recording an unmodified training loop: the window of steps, and the parts that record them.

The recorder wires its parts and moves the window along as steps close: warm-up (the outermost modules and
a batch captured there), measured steps (extended once when periodic work was seen only once), then the
profiler's steps, after which the script is ended; or, where the running loop's cadence (``if step % N``)
reaches beyond the window, its step clock is watched on first (:mod:`.watch`).

Its parts, each with one job: the phase clock (:mod:`.clock`), the step boundaries
(:mod:`.steps`), what the wrappers learn besides time (:mod:`.tallies`), the wrappers around
torch calls (:mod:`.instrument`, which see only the :mod:`.probe`), the outermost module calls
(:mod:`.discovery`), the CPU wait per step (:mod:`.run_queue`), the profiler window (:mod:`.profiling`), CUDA
events and sync-debug (:mod:`.gpu_timing`), the sampler of untimed batch building (:mod:`.gap_sampler`) and
the trace of the user's functions (:mod:`.function_trace`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import statistics
import sys
import threading
from typing import Any, Callable

import torch

from .compile_watch import CompileFacts, CompileWatch
from .graph_watch import GraphWatch
from .loss_capture import LossCapture
from .out_of_memory import OutOfMemory, out_of_memory
from ...data import stats as data_stats
from ...hardware import LoadSample, sample_load
from . import active, instrument, memory_limit, process_starts
from .discovery import ModuleCalls
from .drivers import StepDriver
from .function_trace import FunctionTracer
from .gap_sampler import GapSampler, sampling_interval
from .gpu_timing import GpuTimer
from .patcher import Patcher
from .profiling import PhaseRanges, ProfilerWindow, events_per_step, profile_steps_for, top_ops
from .clock import PhaseClock
from .blocking_collectives import BlockingCollectives
from .collectives import GradientSync, merged
from .probe import Probe, no_device_marks
from .recording import GpuPhases, LiveObjects, MatmulShape, ModuleSite, Recording, SiteCount, Window
from .steps import StepTracker, Stop
from .tallies import Tallies
from .measurements import ForwardFacts, Phase, StepRecord
from .run_queue import RunQueue
from ..sites import user_site
from .schedule import StepSchedule
from .watch import RunWatch
from .window_memory import PeakProbe, WindowMemory
from .cadence import Cadence, PlannedLoop, in_steps, planned_loop, running_cadences

__all__ = ["Recorder", "Stop"]

log = logging.getLogger("turbotrain")

# Under a millisecond of untimed batch building per step, no finding names a line (num-workers needs 1 ms).
GAP_WORTH_SAMPLING_S = 1e-3
GRAPH_SAMPLES = 4  # step boundaries at which the graphs alive are counted (three or more tell growth)


# Warm-up is extended at most this many times more for batches still queued (a loader faster than the step never
# drains: it is not data-bound, and its window need not wait).
MAX_DRAINS = 3


def _nothing() -> None:
    """What puts back a limit that was not lifted."""


def still_draining(queues: list[tuple[int, int]]) -> int:
    """Steps more to drain the loaders' queues ((ready, capacity) each): the most any queue still holds, counting
    only queues the steps have partly drained. A queue full again keeps up with the step (the window finds it full
    whatever it waits); an empty one is drained. Each loader against its own capacity: a small loader's full queue
    is not a large one's partial one."""
    return max((ready for ready, capacity in queues if 0 < ready < capacity), default=0)


class Recorder:
    """Installs the hooks; ``steps`` holds one :class:`StepRecord` per completed optimizer step.

    ``warmup`` steps come first (not measured; the outermost modules and a batch are captured
    there), then ``measure`` steps, then ``profile`` steps under torch.profiler. With
    ``stop=True`` the script is ended (:class:`Stop`) after the last of them.
    """

    def __init__(
        self,
        measure: int | None = 20,
        warmup: int = 3,
        profile: int = 2,
        stop: bool = True,
        capture: bool = True,
        trace_ranges: bool = True,
        sees_construction: bool = False,
        watch_s: float = StepSchedule.WATCH_S,
        record_s: float | None = None,
    ) -> None:
        # Ranks each cutting their own window would end it at different steps, leaving the others in a collective.
        single = _rank_and_world()[1] == 1
        self.schedule = StepSchedule(measure, warmup, profile, stop, watch_s, record_s if single else None)
        self.trace_ranges = trace_ranges
        self.gpu = torch.cuda.is_available()
        self.clock = PhaseClock()
        self.tallies = Tallies()
        self.tracker = StepTracker(self.clock, self.tallies, self._finish_step, sees_construction)
        self.patcher = Patcher()
        self.probe = Probe(
            self.clock,
            self.tallies,
            self.tracker,
            self.schedule,
            threading.get_ident(),
            self.gpu,
            gpu_mark=self.gpu_mark if self.gpu else no_device_marks,
        )
        self.modules = ModuleCalls(self.probe, self.patcher, capture)
        self.probe.modules = self.modules
        self.tracker.on_trained_changed = self.modules.forget_trained
        self.tracker.gpu_mark = self.gpu_mark if self.gpu else None
        self.module_calls_per_step = 0
        self.profile_left_out = 0  # the events a step would have made, where the profiler window was left out
        self._restore_limit: Callable[[], None] = _nothing  # --memory-limit's, lifted for the profiler window
        self._compiles = 0  # torch.compile's compiles under way (a lazy backward's inside a forward's)
        self._restore_compile_limit: Callable[[], None] = _nothing  # --memory-limit's, lifted while they run
        self.window = ProfilerWindow(self.gpu)
        self.gpu_timer = GpuTimer()
        self.profiled_steps: list[int] = []
        self.run_queue = RunQueue()
        self.tracker.preempted = self.run_queue.preempted
        self._handles: list[Any] = []
        self.driver = StepDriver()  # the framework whose loop steps the optimizer
        self._sampler: GapSampler | None = None
        self.watch: RunWatch | None = None  # the step clock after the window (:mod:`.watch`), while it runs
        # The user's functions seen running (warm-up and the profiler window: a trace hook costs a Python
        # call per frame, too much for the measured steps). Static rules ask whether their line's
        # function ran. None: not traced (another tracer, a debugger or coverage, was installed).
        self.functions = FunctionTracer()
        # Machine load over the measured steps (other processes' CPU time), and torch's threads then.
        self.load_start: LoadSample | None = None
        self.load_end: LoadSample | None = None
        self.threads_seen: int | None = None
        self.cadences_at_start: tuple[int, tuple[Cadence, ...]] = (0, ())  # (steps done, the loop's cadences)
        self.planned_loops: list[tuple[int, PlannedLoop]] = []  # (steps done, the stepping loop's range) read
        self.reads_at_start: Any = None
        self.reads_at_end: Any = None
        # DDP's gradient all-reduces, timed per step (exposed communication on a multi-process job).
        self.gradient_sync = GradientSync(self._comm_position, self._recording_live)
        # FSDP's all-gathers and reduce-scatters, and the script's own blocking collectives.
        self.blocking = BlockingCollectives(self._comm_position, self._recording_live)
        # What torch.compile did (graphs, breaks, recompiles, compile time), where the script compiles.
        self.compile_watch: CompileWatch | None = None
        self.compiled: CompileFacts | None = None
        # The loss a compiled model's output goes into, where the script computes it outside the graph.
        self.loss_capture = LossCapture(self._recording_live)
        self._graphs_failed = False  # a count of the graphs alive failed once: no more counts this run
        self._drains = 0  # warm-up extensions for batches the workers still held ready (MAX_DRAINS at most)
        self._eager_look: Any = None  # torch.compiler.set_stance("force_eager"), over a warm-up step or two
        self._eager_closes = 0  # the step boundaries since it was set
        # Graphs kept alive across steps: counted at a few boundaries whose cost lands in no measured step.
        self.graph_watch = GraphWatch()
        self._graphs_sampled_at = -1  # the step boundary last counted
        self.out_of_memory: OutOfMemory | None = None  # the error the script died of, where it was one
        # The memory peak over the measured steps, where asked for (doctor --verify's runs): set before the run.
        self.peak_probe: PeakProbe | None = None
        self.window_memory: WindowMemory | None = None

    def _comm_position(self) -> tuple[int, int]:
        """Where a collective falls: (step index, backward passes so far in it)."""
        return self.tracker.step_index, self.tracker.open_step.backwards

    def _recording_live(self) -> bool:
        return active.current is self.probe

    # -- what the recording holds (read by analysis) ------------------------------------------------

    @property
    def steps(self) -> list[StepRecord]:
        return self.tracker.steps

    @property
    def warmup(self) -> int:
        return self.schedule.warmup

    @property
    def profiling(self) -> bool:
        return self.probe.profiling

    def mark_step(self) -> None:
        """End a step here (loops without a torch optimizer); optimizer steps no longer end steps."""
        self.tracker.mark_step()

    # -- install / uninstall ------------------------------------------------------------------

    def __enter__(self) -> Recorder:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def install(self) -> None:
        if active.current is not None:
            raise RuntimeError("a turbotrain doctor recording is already active in this process")
        active.current = self.probe
        self.probe.thread = threading.get_ident()
        self.tracker.restart()
        self.run_queue.open()
        self.functions.trace(True)
        # Reads through turbotrain.data (any process: DataLoader workers count into a shared file).
        data_stats.share_with_workers()
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.driver.thread = self.probe.thread
        self._handles += [
            register_optimizer_step_pre_hook(self.driver.before_step),
            register_optimizer_step_pre_hook(self.tracker.before_optimizer_step),
            register_optimizer_step_post_hook(self.tracker.after_optimizer_step),
        ]
        try:
            self.compile_watch = CompileWatch(on_compiling=self._compiling)
            self.compile_watch.start()
            self.modules.set_discovery(True)
            instrument.install(self.patcher)
            process_starts.install(self.patcher)
            self.gradient_sync.install(self.patcher)
            self.blocking.install(self.patcher)
            self.loss_capture.install(self.patcher)
            if self.gpu:
                self.gpu_timer.install_sync_debug(self.patcher, self._on_cuda_sync)
        except BaseException:
            self.uninstall()  # never leave torch half-patched
            raise

    def uninstall(self) -> None:
        if active.current is not self.probe:
            return
        self.functions.trace(False)
        if self.load_end is None and self.load_start is not None:
            self.load_end = sample_load()  # the script ended before the window did
        if self._sampler is not None:
            self._sampler.stop()
        self._stop_profiler()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.modules.set_discovery(False, attach=False)
        if self._eager_look is not None:  # the script ended in its eager warm-up step
            self._eager_look.__exit__(None, None, None)
            self._eager_look = None
        self.patcher.restore()
        if self.compile_watch is not None:
            self.compiled, self.compile_watch = self.compile_watch.stop(), None
        if self.gpu:
            self.gpu_timer.remove_sync_debug()
            self.gpu_timer.resolve(block=True)
        self.run_queue.close()
        active.current = None

    def _look_eagerly_next(self, done: int) -> bool:
        """Whether warm-up should run eagerly from here until a module call is seen: discovery found none while
        compiled code traced its hooks, so the script's modules run only inside code it compiled."""
        modules = self.modules
        return (
            modules.discovery
            and not modules.looked_eagerly
            and modules.traced_by_compile
            and not modules.top_modules
            and done < self.warmup
        )

    def _finish_step(self, record: StepRecord) -> None:
        """A step closed: move the window along (warm-up, measured, profiled) and end the script after it."""
        if self.watch is not None:
            if self.watch.add(record):
                self.tracker.stopping = True
                raise Stop()
            return
        if self.gpu:
            self.gpu_timer.resolve(block=False)
        done, schedule = len(self.steps), self.schedule
        if done == schedule.measured_end and not self.profiling:
            schedule.extend_for_period(self.steps)
        measured_end = schedule.measured_end
        looked = False
        if self._eager_look is not None:
            self._eager_closes += 1
            # A step boundary may come before the step's forward (Lightning's, inside optimizer.step) or after it
            # (a plain loop's, at optimizer.step): eager until a forward was seen, or two boundaries passed.
            if self.modules.top_modules or self._eager_closes >= 2:
                self._eager_look.__exit__(None, None, None)  # the compiled code runs again, from its cache
                self._eager_look, looked = None, True
            elif done >= self.warmup:
                schedule.one_more_warmup_step()  # the window opens on compiled steps only
        elif self._look_eagerly_next(done):
            # The script's compiled code (Lightning compiles training_step) called its modules inside a graph,
            # where the discovery hooks never run: warm-up runs eagerly until they are seen called.
            self.module_calls_per_step = record.module_calls
            self.modules.looked_eagerly = True
            self._eager_look, self._eager_closes = torch.compiler.set_stance("force_eager"), 0
        if self.modules.discovery and done >= max(1, self.warmup - 1) and self._eager_look is None:
            if not looked:
                self.module_calls_per_step = record.module_calls  # counted under the global hooks
            self.modules.set_discovery(False)
        if done == self.warmup and not schedule.warmup_extended_by:
            # Off before any extension: traced steps run slower than the workers refill their queue, which
            # would then never drain and the window would open on queued batches after all.
            self.functions.trace(False)
            schedule.extend_warmup(self._prefetched_batches(done))
        elif done == self.warmup and self._drains < MAX_DRAINS and _rank_and_world()[1] == 1:
            # Workers refill while the queue drains (and while slow first steps run): what they still hold
            # ready here would be taken without a wait by the window's first steps. One process only: each
            # rank would count its own queue, and ranks whose windows end at different steps leave the others
            # waiting in a collective.
            # A queue the workers filled again while the steps took as many batches keeps up with the step: the
            # window will find it full whatever it waits (a compute-bound step), so draining on only costs steps.
            ready = still_draining(self._worker_queues(done))
            if ready:
                self._drains += 1
                schedule.drain_more(ready)
        if done == self.warmup:
            schedule.fit_window(self.steps)
            measured_end = schedule.measured_end
            # Read again when the window ends: how far an outer loop's counter moved gives its period in steps.
            self.cadences_at_start = (done, running_cadences(sys._getframe(0)))
            self._read_planned_loop(done)
            self.reads_at_start = data_stats.snapshot()
            self.functions.trace(False)
            self.load_start, self.threads_seen = sample_load(), torch.get_num_threads()
            if self.peak_probe is not None:
                self.peak_probe.start()
        if done == measured_end:
            self._read_planned_loop(done)
            self.reads_at_end = data_stats.snapshot()
            self.load_end = sample_load()
            if self.peak_probe is not None:
                self.window_memory = self.peak_probe.stop()
        if (
            self._sampler is None
            and done >= self.warmup
            and (measured_end is None or done < measured_end)
            and record.gap_before_forward > max(0.1 * record.duration, GAP_WORTH_SAMPLING_S)
        ):
            # The script builds batches itself, untimed: find which line. The sampler costs GIL
            # traffic (on a loaded machine, a descheduled sampler holding the GIL stalls the script,
            # inside the very gap it samples), so only a gap worth a finding gets it. Any step of the
            # window may start it: one step that took 10x the others (a garbage collection of a large
            # heap, in a long test session) must not leave the finding without its line.
            self._sampler = GapSampler(
                self.tracker,
                self.tallies.gap_samples,
                self.warmup,
                sampling_interval(record.gap_before_forward, schedule.measure),
                schedule.measure,
            )
            self._sampler.start()
        if done == measured_end and self._sampler is not None:
            self._sampler.stop()
        self._sample_graphs(done)  # before the profiler starts here (its walk would sit in a profiled step)
        if schedule.profile_steps and done == schedule.profile_at:
            schedule.cut_profile(profile_steps_for(self.module_calls_per_step, schedule.profile_steps))
            if schedule.profile_steps:
                self.functions.trace(True)
                self._start_profiler()
            else:  # a step too large to profile: its events would take gigabytes (record/profiling.py)
                self.profile_left_out = events_per_step(self.module_calls_per_step)
        elif self.profiling:
            if done >= schedule.profile_at + schedule.profile_steps:
                self._stop_profiler()
            else:
                self.profiled_steps.append(done)
                self.window.open_step_range(done)
        self._sample_graphs(done)  # ... or after it stopped here
        if schedule.stop_after is not None and done >= schedule.stop_after:
            if self._start_watch(done):
                return
            self.tracker.stopping = True
            raise Stop()

    def _sample_graphs(self, done: int) -> None:
        """Count the autograd graphs alive at this boundary (once), up to four times, only where the count's cost
        (a walk of the garbage collector's objects, 90 ms with torch.compile's modules loaded) cannot fall into a
        measured or a profiled step."""
        end = self.schedule.measured_end
        off_window = done < self.warmup or (end is not None and done >= end)
        if (
            off_window
            and not self.profiling
            and self._graphs_sampled_at != done
            and self.graph_watch.samples < GRAPH_SAMPLES
            and not self._graphs_failed
        ):
            self._graphs_sampled_at = done
            try:
                self.graph_watch.sample(done, sys._getframe(2))
            except Exception as exc:  # noqa: BLE001 - the count is the doctor's own business: never the script's end
                self._graphs_failed = True
                log.info("turbotrain doctor: graphs kept alive not counted: %s: %s", type(exc).__name__, exc)

    def failed(self, exc: BaseException) -> None:
        """The script raised ``exc``: keep it as an out-of-memory error, with its step, where it is one."""
        found = out_of_memory(exc)
        if found is not None:
            self.out_of_memory = dataclasses.replace(found, step=self.tracker.step_index)
            # An optimizer that never stepped (the run died in its first step) is held by the script's frames only,
            # which go with this traceback: kept, the step measured after counts its state (Adam's: twice the
            # parameters) in what the batch needs.
            for optimizer in self.tallies.live_optimizers():
                self.tracker.kept_optimizers.setdefault(id(optimizer), optimizer)

    def _read_planned_loop(self, done: int) -> None:
        """The stepping loop's range and counter now (:func:`.cadence.planned_loop`), with the steps done."""
        try:
            loop = planned_loop(sys._getframe(0))
        except Exception:  # noqa: BLE001 - reading the user's loop must never cost the recording
            loop = None
        if loop is not None:
            self.planned_loops.append((done, loop))

    def _start_watch(self, done: int) -> bool:
        """At the window's end: watch the step clock on where the running loop's cadences reach beyond it."""
        if not self.schedule.watches or _rank_and_world()[1] > 1:
            # Ranks would end their watches at different steps (time, occurrences) and leave the others
            # waiting in a collective: a multi-process job ends with the window.
            return False
        start, before = self.cadences_at_start
        cadences = in_steps(running_cadences(sys._getframe(1)), before, done - start)
        if not RunWatch.wanted(cadences, done):
            return False
        measured = [s.duration - (s.preempted or 0.0) for s in self.steps[self.warmup :] if not s.profiled]
        baseline = statistics.median(measured or [s.duration for s in self.steps[-3:]])
        self.functions.trace(False)  # a Python call per frame would slow the watched steps
        self.tracker.watching = True
        self.watch = RunWatch(cadences, baseline, done, self.schedule.watch_s)
        return True

    def _prefetched_batches(self, done: int) -> int:
        """Batches the workers of the DataLoaders used in warm-up may hold ready (workers x prefetch_factor).

        Workers fill that queue while they start and while the first steps run; a window opening on a full
        queue takes its first batches without waiting, and a data-bound step reads as faster and less
        data-bound than it is. Warm-up is extended by as many steps, which a data-bound loop needs to drain it."""
        return max((capacity for _, capacity in self._worker_queues(done)), default=0)

    def _worker_queues(self, done: int) -> list[tuple[int, int]]:
        """(batches ready now, batches the queue holds) of each DataLoader with workers read in the first ``done``
        steps; ready is 0 where torch does not say."""
        queues = []
        for record in self.tallies.loaders.values():
            workers = record.settings.get("num_workers") or 0
            if not workers or not any(step < done for step in record.nexts.by_step):
                continue
            capacity = workers * (record.settings.get("prefetch_factor") or 2)
            it = record.iterator() if record.iterator is not None else None
            try:
                # The iterator's private queue and task table: torch offers no public count of ready batches.
                queued = it._data_queue.qsize() if it is not None else 0
                early = sum(1 for task in it._task_info.values() if len(task) == 2) if it is not None else 0
            except (AttributeError, NotImplementedError):  # not a worker iterator; qsize() on macOS
                queued = early = 0
            queues.append((queued + early, capacity))
        return queues

    @property
    def profiler(self) -> Any:
        """torch.profiler.profile of the profiler window, once it ran (None before, or if it could not start)."""
        return self.window.profiler

    def _compiling(self, started: bool) -> None:
        """torch.compile started or ended a compile: the function tracer pauses, and --memory-limit is lifted while
        compiles run (Inductor's compile work and its threads are the compiler's host memory, not the step's: under
        100 MiB nanoGPT's first compile failed, "can't start new thread")."""
        self.functions.pause(started)
        if started:
            self._compiles += 1
            if self._compiles == 1:
                self._restore_compile_limit = memory_limit.lift()
        elif self._compiles:
            self._compiles -= 1
            if not self._compiles:
                self._restore_compile_limit()
                self._restore_compile_limit = _nothing

    def _start_profiler(self) -> None:
        # torch.profiler's events are the doctor's memory, not the step's: under --memory-limit they would make the
        # script run out of memory in a step that fitted before.
        self._restore_limit = memory_limit.lift()
        if self.window.start(len(self.steps)):
            self.probe.profiling = self.tracker.profiling = True
            if self.trace_ranges:
                self.clock.spans = PhaseRanges(self.window.nvtx)
            self.profiled_steps.append(len(self.steps))
        else:
            self._stop_profiler()  # it could not start: the limit holds again

    def _stop_profiler(self) -> None:
        if self.probe.profiling:
            self.probe.profiling = self.tracker.profiling = False
            self.clock.end_spans()
            self.window.stop()
        self._restore_limit()
        self._restore_limit = _nothing

    def gpu_mark(self, phase: Phase, start: bool) -> None:
        """CUDA events around a phase of a measured step (device time per phase)."""
        index = self.tracker.step_index
        if index >= self.warmup and self.watch is None:
            self.gpu_timer.mark(phase, start, index)

    def _on_cuda_sync(self, frame: Any) -> None:
        if not self.probe.busy and threading.get_ident() == self.probe.thread:
            tally = self.tallies.tally("sync:cuda", user_site(frame))
            if tally is not None:
                tally.add(self.tracker.step_index)

    # -- the finished recording ------------------------------------------------------------------

    def recording(self) -> Recording:
        """What was recorded, as plain data (call after the script ended)."""
        from .profiling import graph_time, op_counts

        tallies, schedule = self.tallies, self.schedule
        profiled = tuple(i for i in self.profiled_steps if i < len(self.steps))
        module_sites = tuple(
            ModuleSite(key, site)
            for key, (ref, site) in tallies.module_sites.items()
            if ref() is not None and id(ref()) == key
        )
        rank, world = _rank_and_world()
        return Recording(
            window=Window(
                schedule.warmup,
                schedule.measure,
                schedule.asked,
                schedule.profile_steps,
                schedule.warmup_extended_by,
                profiled,
                self.profiler is not None,
                self.profile_left_out,
                schedule.cut_for_step_s,
            ),
            steps=tuple(self.steps),
            step_delimiter=self.tracker.delimiter,
            events=tuple(t.freeze(kind, site) for (kind, site), t in tallies.events.items()),
            loaders=tuple(record.freeze(key) for key, record in tallies.loaders.items()),
            optimizer_sites=tuple(site for ref, site in tallies.optimizers if ref() is not None),
            module_sites=module_sites,
            matmul_shapes=tuple(MatmulShape(site, a, b) for site, (a, b) in tallies.matmul_shapes.items()),
            gap_samples=tuple(SiteCount(site, n) for site, n in tallies.gap_samples.items()),
            zero_grad_before_backward=tallies.zero_grads["before_backward"],
            zero_grad_elsewhere=tallies.zero_grads["elsewhere"],
            facts=self._facts(),
            module_calls_per_step=self.module_calls_per_step,
            profile=op_counts(self.profiler, len(profiled)),
            top_ops=tuple(top_ops(self.profiler, len(profiled))),
            gpu_phases=tuple(GpuPhases(step, dict(phases)) for step, phases in self.gpu_timer.phase_seconds.items()),
            ran_lines=_lines_by_file(self.functions.ran_code),
            load_start=self.load_start,
            load_end=self.load_end,
            threads_seen=self.threads_seen,
            reads=_reads(self.reads_at_start, self.reads_at_end),
            rank=rank,
            world_size=world,
            watched=self.watch.freeze() if self.watch is not None else None,
            host=socket.gethostname(),
            driver=self.driver.name,
            communication=merged(self.gradient_sync.steps(), self.blocking.steps()),
            reducer=self.gradient_sync.reducer_stats(),
            input_numel=dict(self.modules.input_numel),
            compiled=(
                # No graph captured: torch's "Torch-Compiled Region" ranges then hold only eager code, no graph.
                dataclasses.replace(
                    self.compiled, in_graphs=graph_time(self.profiler) if self.compiled.graphs else None
                )
                if self.compiled is not None and self.compiled.compiled
                else None
            ),
            planned_loop=tuple(self.planned_loops),
            graph_growth=self.graph_watch.result(),
            tensor_growth=self.graph_watch.kept_result(),
            out_of_memory=self.out_of_memory,
        )

    def _facts(self) -> ForwardFacts | None:
        """The training forward's facts; a model found in an eager warm-up step is compiled only where torch
        compiled some of the script's code: a module compiled in place whose call is all torch's own code
        (``nn.Sequential(...).compile()``) compiles nothing and runs eagerly, while its hooks were traced."""
        facts = self.modules.facts
        if facts is not None and self.modules.looked_eagerly and not (self.compiled and self.compiled.compiled):
            return dataclasses.replace(facts, compiled=False)
        return facts

    def live_objects(self) -> LiveObjects:
        """The objects only this process has, for the what-ifs and the trace."""
        modules = [m for m in (ref() for ref in self.modules.top_modules.values()) if m is not None]
        if self.modules.capture is not None and self._sampler is not None:
            self.modules.capture.namespaces = dict(self._sampler.namespaces)
        trained = next((m for m in modules if self.modules.is_trained(m)), None)
        return LiveObjects(
            capture=self.modules.capture,
            optimizers=self.tallies.live_optimizers(),
            modules=modules,
            trained=trained,
            eval_grad_inputs=self.modules.eval_grad_inputs,
            loaders={key: record.loader for key, record in self.tallies.loaders.items()},
            profiler=self.profiler,
            eager_loss=self.loss_capture.found,
        )


def _lines_by_file(codes: dict[int, Any] | None) -> dict[str, tuple[int, ...]] | None:
    """The lines of the code objects that ran (by id), per file (None: the run could not tell)."""
    if codes is None:
        return None
    lines: dict[str, set[int]] = {}
    for code in codes.values():
        lines.setdefault(code.co_filename, set()).update(line for _, _, line in code.co_lines() if line is not None)
    return {file: tuple(sorted(found)) for file, found in sorted(lines.items())}


def _reads(start: Any, end: Any) -> Any:
    """Reads through ``turbotrain.data`` during the measured steps (a run cut short: up to its end); None when
    nothing was read. DataLoader workers count into the same shared counters."""
    if start is None:
        return None
    reads = (end or data_stats.snapshot()) - start
    return reads if reads.schemes else None


def _rank_and_world() -> tuple[int, int]:
    try:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
    except RuntimeError:  # a process group torn down by the script: read the launcher's environment
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
