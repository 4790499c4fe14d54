"""Recording an unmodified training loop: the step clock.

Steps are delimited by the optimizer itself (global step hooks), so any loop style works: a
DataLoader, a generator, pre-built tensors, one optimizer or several; without an optimizer, by
``loss.backward()``, or by ``watch.step()``. Inside a step the recorder keeps a stack of *phases*
(waiting on the loader, host-to-device copies, forward, backward, optimizer, host syncs,
validation forwards, checkpoints) and charges each moment to the innermost one, so the phases add
up to the step without double counting. The window is warm-up, measured steps (extended once when
periodic work was seen only once), then the profiler's steps.

Its parts, each with one job: the wrappers that push and pop phases (:mod:`.instrument`), the
outermost module calls (:mod:`.discovery`), the step in progress (:mod:`.open_step`), the CPU wait
per step (:mod:`.run_queue`), the profiler window (:mod:`.profiling`), CUDA events and sync-debug
(:mod:`.gpu_timing`), the sampler of untimed batch building (:mod:`.gap_sampler`) and the trace of
the user's functions (:mod:`.function_trace`). Syncs are recorded with the user's ``file:line``:
on CUDA every synchronizing call (``torch.cuda.set_sync_debug_mode``); on CPU the same tensor
methods when the user's own code calls them, since they would stall a GPU.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import Counter
from typing import Any

import torch

from ..data import stats as data_stats
from ..hardware import sample_load
from . import active, instrument
from .discovery import ModuleCalls
from .function_trace import FunctionTracer
from .gap_sampler import GapSampler, sampling_interval
from .gpu_timing import GpuTimer
from .patching import Patcher
from .profiling import ProfilerWindow
from .open_step import Closed, OpenStep
from .records import LoaderRecord, StepRecord, Tally
from .run_queue import RunQueue
from .sites import Site, user_site
from .step_schedule import StepSchedule

__all__ = ["Recorder", "Stop", "active_recorder"]

log = logging.getLogger("turbotrain")

perf_counter = time.perf_counter
get_ident = threading.get_ident


# Under a millisecond of untimed batch building per step, no finding names a line (num-workers needs 1 ms).
GAP_WORTH_SAMPLING_S = 1e-3


class Stop(BaseException):
    """Ends the user's script once enough steps were measured (a BaseException, so ``except Exception`` in the
    script does not swallow it)."""


def active_recorder() -> "Recorder | None":
    return active.current


class Recorder:
    """Installs the hooks; ``steps`` holds one :class:`StepRecord` per completed optimizer step.

    ``warmup`` steps come first (not measured; the outermost modules and a batch are captured
    there), then ``measure`` steps, then ``profile`` steps under torch.profiler. With
    ``stop=True`` the script is ended (:class:`Stop`) after the last of them.
    """

    def __init__(self, measure: int | None = 20, warmup: int = 3, profile: int = 2, stop: bool = True,
                 capture: bool = True, trace_ranges: bool = True, sees_construction: bool = False) -> None:
        self.schedule = StepSchedule(measure, warmup, profile, stop)
        self.manual_steps = False             # steps marked by mark_step(), not by optimizers
        # Steps delimited by loss.backward(): no optimizer ever stepped (a hand-written update). With
        # ``sees_construction`` (installed before the script ran) a script that built no optimizer is
        # known at its first backward; otherwise a known optimizer may still step after accumulating.
        self.backward_steps = False
        self.sees_construction = sees_construction
        self._backwards_unstepped = 0
        self._optimizer_stepped = False
        self.pending_update = False            # a backward ended; the step closes when the next one starts
        self.trace_ranges = trace_ranges

        self.steps: list[StepRecord] = []
        self.tallies: dict[tuple[str, Site], Tally] = {}
        self.loaders: dict[int, LoaderRecord] = {}
        self.optimizers: list[tuple[weakref.ReferenceType, Site | None]] = []
        self.module_sites: dict[int, tuple[weakref.ReferenceType, Site]] = {}  # id -> (module, where built)
        self.modules = ModuleCalls(self, capture)
        self.module_calls_per_step = 0
        self.window = ProfilerWindow(torch.cuda.is_available())
        self.gpu_timer = GpuTimer()
        self.profiled_steps: list[int] = []
        self.matmul_shapes: dict[Site, tuple] = {}
        self.gpu = torch.cuda.is_available()
        self.started = self.finished = 0.0
        self.run_queue = RunQueue()

        self.patcher = Patcher()
        self._handles: list[Any] = []
        self.thread = threading.get_ident()
        self.stack: list[list] = []          # [phase, resume_time, record_function or None]
        self.open_step = OpenStep(0.0)
        self.busy = False
        self._stopping = False
        self._optimizer_ids: set[int] = set()
        self._kept: dict[int, Any] = {}
        self._expected: set[int] = set()   # the optimizers that stepped in the last step
        self.profiling = False
        self.gap_samples: Counter = Counter()   # user lines seen running between steps, before the forward
        # zero_grad calls between a step's forward and its backward, and elsewhere (before the forward,
        # after the optimizer step): the fresh-process trials clear gradients where the script does.
        self.zero_grads = Counter()
        self._sampler: GapSampler | None = None
        # The user's functions seen running (warm-up and the profiler window: a trace hook costs a Python
        # call per frame, too much for the measured steps). Static rules ask whether their line's
        # function ran. None: not traced (another tracer, a debugger or coverage, was installed).
        self.functions = FunctionTracer()
        # Machine load over the measured steps (other processes' CPU time), and torch's threads then.
        self.load_start = self.load_end = None
        self.threads_seen: int | None = None

    # -- install / uninstall ------------------------------------------------------------------

    def __enter__(self) -> "Recorder":
        self.install()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def install(self) -> None:
        if active.current is not None:
            raise RuntimeError("a turbotrain doctor recording is already active in this process")
        active.current = self
        self.thread = threading.get_ident()
        self.run_queue.open()
        self.started = perf_counter()
        self.functions.trace(True)
        # Reads through turbotrain.data (any process: DataLoader workers count into a shared file).
        data_stats.share_with_workers()
        self.reads_at_start = self.reads_at_end = None
        self.open_step = OpenStep(self.started)
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles += [register_optimizer_step_pre_hook(self._on_opt_pre),
                          register_optimizer_step_post_hook(self._on_opt_post)]
        try:
            self.modules.set_discovery(True)
            instrument.install(self, self.patcher)
            if self.gpu:
                self.gpu_timer.install_sync_debug(self.patcher, self._on_cuda_sync)
        except BaseException:
            self.uninstall()  # never leave torch half-patched
            raise

    def uninstall(self) -> None:
        if active.current is not self:
            return
        self.finished = perf_counter()
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
        self.patcher.restore()
        if self.gpu:
            self.gpu_timer.remove_sync_debug()
            self.gpu_timer.resolve(block=True)
        self.run_queue.close()
        active.current = None

    # -- the phase stack ------------------------------------------------------------------------

    def on_main_thread(self) -> bool:
        return threading.get_ident() == self.thread

    @property
    def warmup(self) -> int:
        return self.schedule.warmup

    @property
    def measure(self) -> int | None:
        """Measured steps, after any extension for periodic work."""
        return self.schedule.measure

    @property
    def step_index(self) -> int:
        """The step an event now belongs to."""
        n = len(self.steps)
        if not self._expected and self.open_step.snapshot is not None and self.optimizer_delimits:
            # The first step ends at its last optimizer step, which is only known when an optimizer
            # steps a second time; until then, what follows an optimizer step counts as the next step.
            return n + 1
        return n

    def push(self, phase: str) -> None:
        now = perf_counter()
        stack = self.stack
        if stack:
            top = stack[-1]
            self.open_step.acc[top[0]] += now - top[1]
            top[4] += now - top[1]
        rf = None
        if self.profiling and self.trace_ranges:
            rf = torch.autograd.profiler.record_function(f"turbotrain/{phase}")
            rf.__enter__()
            if self.window.nvtx:
                torch.cuda.nvtx.range_push(f"turbotrain/{phase}")
        stack.append([phase, now, rf, now, 0.0])  # phase, running since, range, started, own seconds so far

    def pop(self, record_as: str | None = "") -> float:
        """End the innermost phase and return its own (exclusive) seconds.

        ``record_as`` names the phase to charge instead (a copy that turned out to be a sync);
        None gives the time back to the enclosing phase (a ``.to(dtype)`` that copied nothing).
        """
        now = perf_counter()
        stack = self.stack
        if not stack:
            return 0.0
        phase, running, rf, _, own = stack.pop()
        if rf is not None:
            rf.__exit__(None, None, None)
            if self.window.nvtx:
                torch.cuda.nvtx.range_pop()
        acc = self.open_step.acc
        own_total = own + (now - running)
        if record_as is None:
            acc[phase] -= own
            if stack:
                acc[stack[-1][0]] += own_total
                stack[-1][4] += own_total
        else:
            if record_as and record_as != phase:
                acc[phase] -= own
                acc[record_as] += own_total
            else:
                acc[phase] += now - running
        if stack:
            stack[-1][1] = now
        return own_total

    def timed_so_far(self) -> float:
        """Seconds of the open step charged to phases up to now (flushing the running phase)."""
        if self.stack:
            top = self.stack[-1]
            now = perf_counter()
            self.open_step.acc[top[0]] += now - top[1]
            top[4] += now - top[1]
            top[1] = now
        return sum(self.open_step.acc.values())

    def tally(self, kind: str, site: Site | None) -> Tally | None:
        if site is None:
            return None
        key = (kind, site)
        t = self.tallies.get(key)
        if t is None:
            t = self.tallies[key] = Tally()
        return t

    # -- optimizer steps: the step boundaries ---------------------------------------------------

    def _on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if get_ident() != self.thread:
            return
        if self._stopping:
            raise Stop()
        if id(optimizer) not in self._optimizer_ids:
            self.note_optimizer(optimizer, None)
        self._optimizer_stepped = True
        if id(optimizer) not in self._kept:
            # Held until the report is built: the script's namespace (and its last reference) goes when the
            # doctor ends it, and the optimizer rules and what-ifs read these objects after.
            self._kept[id(optimizer)] = optimizer
        opened = self.open_step
        if id(optimizer) in opened.stepped and opened.snapshot is not None and self.optimizer_delimits:
            # This optimizer already stepped since the last boundary: the previous step ended at
            # the last optimizer step (a loop with several optimizers, first steps).
            self._close_lazily()
        self.push("optimizer")
        self.open_step.stepped.add(id(optimizer))
        if self.gpu:
            self.gpu_mark("optimizer", start=True)

    def _on_opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if get_ident() != self.thread:
            return
        if self.gpu:
            self.gpu_mark("optimizer", start=False)
        self.pop()
        opened = self.open_step
        opened.opt_steps += 1
        now = perf_counter()
        expected = self._expected
        if not self.optimizer_delimits:
            return
        if expected and expected <= opened.stepped:
            self._close(now)
            return
        # The step may go on (another optimizer) or may have ended (known at the next optimizer step).
        opened.take_snapshot(now)

    def mark_step(self) -> None:
        """End a step here (loops without a torch optimizer); optimizer steps no longer end steps."""
        if not self.on_main_thread():
            return
        if self._stopping:
            raise Stop()
        self.manual_steps = True
        self.open_step.opt_steps = max(self.open_step.opt_steps, 1)
        self._close(perf_counter())

    @property
    def step_delimiter(self) -> str:
        if self.manual_steps:
            return "watch.step()"
        return "loss.backward()" if self.backward_steps else "optimizer.step()"

    @property
    def optimizer_delimits(self) -> bool:
        return not (self.manual_steps or self.backward_steps)

    # Backwards before a script that built optimizers is taken to update weights by hand: gradient
    # accumulation over more micro-batches than this is rare (nanoGPT's default is 40).
    BACKWARDS_WITHOUT_STEP = 64

    def after_backward(self) -> None:
        """A backward ended. Without optimizer steps, it ends the step's compute: what follows until the
        next step starts (a data fetch or a training forward) is the hand-written update."""
        if self.manual_steps or self._optimizer_stepped:
            return
        if not self.backward_steps:
            self._backwards_unstepped += 1
            known = bool(self.optimizers) or not self.sees_construction
            if known and self._backwards_unstepped < self.BACKWARDS_WITHOUT_STEP:
                return
            self.backward_steps = True
            self.modules.forget_trained()  # trained now means "has trainable parameters"
            log.info("turbotrain doctor: no optimizer step after %d backward(s): steps are delimited by "
                     "loss.backward()", self._backwards_unstepped)
        if self.pending_update:  # two backwards in a row (a second loss): the update comes after the last
            self.pop()
        self.pending_update = True
        self.push("update")

    def step_starts(self) -> None:
        """A data fetch or a training forward: in backward-delimited steps, the previous step ends here."""
        if not self.pending_update:
            return
        self.pending_update = False
        while self.stack and self.stack[-1][0] != "update":
            self.pop()  # defensive: phases opened inside the update (never left open by the wrappers)
        if self.stack:
            self.pop()
        self.open_step.opt_steps = max(self.open_step.opt_steps, 1)
        self._close(perf_counter())

    def _close(self, now: float) -> None:
        opened = self.open_step
        if self.stack:  # a phase still running (a step inside a forward): split it at the boundary
            top = self.stack[-1]
            opened.acc[top[0]] += now - top[1]
            top[1] = now
            for entry in self.stack:
                entry[4] = 0.0  # what it ran so far stays in the closed step
        record = self._record(opened.start, opened.closed_at(now))
        self._expected = set(opened.stepped)
        self.open_step = fresh = OpenStep(now)
        self._finish_step(record)
        if self.open_step is fresh and not fresh.acc:
            fresh.start = perf_counter()  # the doctor's own bookkeeping above is not the next step's time

    def _close_lazily(self) -> None:
        opened = self.open_step
        done, rest = opened.split()
        record = self._record(opened.start, done)
        self._expected = set(opened.stepped)
        self.open_step = rest
        self._finish_step(record)

    def _record(self, start: float, done: Closed) -> StepRecord:
        index = len(self.steps)
        for site, seconds in done.pending_eval_grad:  # eval-mode forwards with autograd on that no backward used
            tally = self.tally("eval_grad_forward", site)
            if tally is not None:
                tally.add(index, seconds)
        gap = 0.0
        if done.marks:
            t, timed = done.marks[0]
            gap = max(0.0, (t - start) - timed)
        return StepRecord(index=index, start=start, end=done.end, phases={k: v for k, v in done.acc.items() if v},
                          gap_before_forward=gap, forwards=done.forwards, backwards=done.backwards,
                          optimizers=done.opt_steps, module_calls=done.module_calls, profiled=self.profiling,
                          preempted=self.run_queue.preempted(done.end - start))

    def _finish_step(self, record: StepRecord) -> None:
        self.steps.append(record)
        if self.gpu:
            self.gpu_timer.resolve(block=False)
        done, schedule = len(self.steps), self.schedule
        if done == schedule.measured_end and not self.profiling:
            schedule.extend_for_period(self.steps)
        measured_end = schedule.measured_end
        if done == max(1, self.warmup - 1) and not schedule.warmup_extended_by:
            self.module_calls_per_step = record.module_calls  # counted under the global hooks
            self.modules.set_discovery(False)
        if done == self.warmup:
            schedule.extend_warmup(self._prefetched_batches(done))
        if done == self.warmup:
            self.reads_at_start = data_stats.snapshot()
            self.functions.trace(False)
            self.load_start, self.threads_seen = sample_load(), torch.get_num_threads()
        if done == measured_end:
            self.reads_at_end = data_stats.snapshot()
            self.load_end = sample_load()
        if (self._sampler is None and done >= self.warmup and (measured_end is None or done < measured_end)
                and record.gap_before_forward > max(0.1 * record.duration, GAP_WORTH_SAMPLING_S)):
            # The script builds batches itself, untimed: find which line. The sampler costs GIL
            # traffic (on a loaded machine, a descheduled sampler holding the GIL stalls the script,
            # inside the very gap it samples), so only a gap worth a finding gets it. Any step of the
            # window may start it: one step that took 10x the others (a garbage collection of a large
            # heap, in a long test session) must not leave the finding without its line.
            self._sampler = GapSampler(self, sampling_interval(record.gap_before_forward, schedule.measure))
            self._sampler.start()
        if done == measured_end and self._sampler is not None:
            self._sampler.stop()
        if schedule.profile_steps and done == schedule.profile_at:
            self.functions.trace(True)
            self._start_profiler()
        elif self.profiling:
            if done >= schedule.profile_at + schedule.profile_steps:
                self._stop_profiler()
            else:
                self.profiled_steps.append(done)
                self.window.open_step_range(done)
        if schedule.stop_after is not None and done >= schedule.stop_after:
            self._stopping = True
            raise Stop()

    def _prefetched_batches(self, done: int) -> int:
        """Batches the workers of the DataLoaders used in warm-up may hold ready (workers x prefetch_factor).

        Workers fill that queue while they start and while the first steps run; a window opening on a full
        queue takes its first batches without waiting, and a data-bound step reads as faster and less
        data-bound than it is (seen: 3.9 ms a step measured, 6.4 ms steady, with 4 workers). Warm-up is
        extended by as many steps, which a data-bound loop needs to drain it."""
        queued = 0
        for record in self.loaders.values():
            workers = record.settings.get("num_workers") or 0
            if workers and record.nexts.total(range(done))[0]:
                queued = max(queued, workers * (record.settings.get("prefetch_factor") or 2))
        return queued

    def note_optimizer(self, optimizer: Any, site: Site | None) -> None:
        if id(optimizer) not in self._optimizer_ids:
            self._optimizer_ids.add(id(optimizer))
            self.optimizers.append((weakref.ref(optimizer), site))
        self.modules.forget_trained()

    @property
    def profiler(self) -> Any:
        """torch.profiler.profile of the profiler window, once it ran (None before, or if it could not start)."""
        return self.window.profiler

    @property
    def ran_code(self) -> set[Any] | None:
        """The user's code objects seen running (warm-up and the profiler window); None: not traced."""
        return self.functions.ran_code

    @property
    def gpu_phase_seconds(self) -> dict[int, dict[str, float]]:
        return self.gpu_timer.phase_seconds

    def _start_profiler(self) -> None:
        if self.window.start(len(self.steps)):
            self.profiling = True
            self.profiled_steps.append(len(self.steps))

    def _stop_profiler(self) -> None:
        if self.profiling:
            self.profiling = False
            self.window.stop(self.stack)

    def gpu_mark(self, phase: str, start: bool) -> None:
        """CUDA events around a phase of a measured step (device time per phase)."""
        if self.gpu and self.step_index >= self.warmup:
            self.gpu_timer.mark(phase, start, self.step_index)

    def _on_cuda_sync(self, frame: Any) -> None:
        if not self.busy and self.on_main_thread():
            tally = self.tally("sync:cuda", user_site(frame))
            if tally is not None:
                tally.add(self.step_index)
