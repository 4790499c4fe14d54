"""Recording an unmodified training loop: step boundaries, time per phase, syncs and copies by site.

Steps are delimited by the optimizer itself (global step hooks), so any loop style works:
a DataLoader, a generator, pre-built tensors, one optimizer or several. Inside a step the
recorder keeps a stack of *phases* (waiting on the loader, host-to-device copies, forward,
backward, optimizer, host syncs, validation forwards, checkpoints) and charges each moment to
the innermost one, so the phases add up to the step without double counting.

Cost: a few Python calls per phase per step. Global module hooks (which slow every module
call) are on only during warm-up, to find the outermost modules; measured steps hook just
those. Syncs are recorded with the user's ``file:line``: on CUDA every synchronizing call
(``torch.cuda.set_sync_debug_mode``); on CPU the same tensor methods when the user's own code
calls them, since they would stall a GPU.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import threading
import time
import weakref
from collections import Counter, defaultdict
from typing import Any

import torch
from torch import nn

from ..data import stats as data_stats
from ..hardware import sample_load
from . import active, instrument
from .forward_facts import capture_inputs, forward_facts
from .function_trace import FunctionTracer
from .gap_sampler import GapSampler
from .gpu_timing import GpuTimer
from .patching import Patcher
from .profiling import ProfilerWindow
from .records import Capture, ForwardFacts, LoaderRecord, StepRecord, Tally
from .sites import Site, user_site

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


class _OpenStep:
    """Accumulators of the step in progress (and a snapshot at its last optimizer step)."""

    __slots__ = ("start", "acc", "marks", "forwards", "backwards", "opt_steps", "stepped", "snapshot",
                 "pending_eval_grad", "module_calls")

    def __init__(self, start: float, acc: dict[str, float] | None = None) -> None:
        self.start = start
        self.acc: dict[str, float] = defaultdict(float, acc or {})
        self.marks: list[tuple[float, float]] = []     # (time, timed seconds so far) at each training forward
        self.forwards = self.backwards = self.opt_steps = self.module_calls = 0
        self.stepped: set[int] = set()
        self.snapshot: tuple | None = None
        self.pending_eval_grad: list[tuple[Site | None, float]] = []


class Recorder:
    """Installs the hooks; ``steps`` holds one :class:`StepRecord` per completed optimizer step.

    ``warmup`` steps come first (not measured; the outermost modules and a batch are captured
    there), then ``measure`` steps, then ``profile`` steps under torch.profiler. With
    ``stop=True`` the script is ended (:class:`Stop`) after the last of them.
    """

    def __init__(self, measure: int | None = 20, warmup: int = 3, profile: int = 2, stop: bool = True,
                 capture: bool = True, trace_ranges: bool = True, sees_construction: bool = False) -> None:
        if warmup < 1:
            raise ValueError("warmup must be >= 1: the first step also holds the script's setup time")
        self.measure, self.warmup, self.profile_steps = measure, warmup, profile
        # With no end in sight (measure=None) the profiler window comes right after warm-up.
        self.profile_at = warmup if measure is None else warmup + measure
        self._measure_asked = measure
        self._extension_started: float | None = None
        self._extension_limit = 0
        self.stop_after = warmup + measure + profile if stop and measure is not None else None
        self.manual_steps = False             # steps marked by mark_step(), not by optimizers
        # Steps delimited by loss.backward(): no optimizer ever stepped (a hand-written update). With
        # ``sees_construction`` (installed before the script ran) a script that built no optimizer is
        # known at its first backward; otherwise a known optimizer may still step after accumulating.
        self.backward_steps = False
        self.sees_construction = sees_construction
        self._backwards_unstepped = 0
        self._optimizer_stepped = False
        self._pending_update = False           # a backward ended; the step closes when the next one starts
        self.want_capture = capture
        self.trace_ranges = trace_ranges

        self.steps: list[StepRecord] = []
        self.tallies: dict[tuple[str, Site], Tally] = {}
        self.loaders: dict[int, LoaderRecord] = {}
        self.optimizers: list[tuple[weakref.ReferenceType, Site | None]] = []
        self.module_sites: dict[int, tuple[weakref.ReferenceType, Site]] = {}  # id -> (module, where built)
        self.top_modules: dict[int, weakref.ReferenceType] = {}
        self.module_calls_per_step = 0
        self.facts: ForwardFacts | None = None
        self.capture: Capture | None = None
        self.window = ProfilerWindow(torch.cuda.is_available())
        self.gpu_timer = GpuTimer()
        self.profiled_steps: list[int] = []
        self.matmul_shapes: dict[Site, tuple] = {}
        self.gpu = torch.cuda.is_available()
        self.started = self.finished = 0.0
        self._sched_fd: int | None = None
        self._last_wait = 0
        self._since_read = 0
        self._recent: list[float] = []

        self._patcher = Patcher()
        self._handles: list[Any] = []
        self.thread = threading.get_ident()
        self.stack: list[list] = []          # [phase, resume_time, record_function or None]
        self.open_step = _OpenStep(0.0)
        self._depth = 0
        self._top_phases: list[str] = []
        self.busy = False
        self._stopping = False
        self.discovery = True
        self._trained_ids: set[int] | None = None
        self._optimizer_ids: set[int] = set()
        self._kept: dict[int, Any] = {}
        self._facts_final = self._capture_final = False
        self._last_top_phase = ""
        self._gpu_forward_open = False
        self._expected: set[int] = set()
        self._trained_cache: dict[int, bool] = {}
        self.profiling = False
        self.gap_samples: Counter = Counter()   # user lines seen running between steps, before the forward
        self._sampler: GapSampler | None = None
        self.top_ids: set[int] = set()
        self._wrapped_classes: set[type] = set()
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
        try:
            # Run-queue wait of this thread (Linux schedstat): time it was ready to run but another
            # process had the core. Read per step, it tells machine noise from the script's own time.
            self._sched_fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._sched_fd = None
        self.started = perf_counter()
        self.functions.trace(True)
        # Reads through turbotrain.data (any process: DataLoader workers count into a shared file).
        data_stats.share_with_workers()
        self.reads_at_start = self.reads_at_end = None
        self.open_step = _OpenStep(self.started)
        self._last_wait = self.runqueue_wait()
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles += [register_optimizer_step_pre_hook(self._on_opt_pre),
                          register_optimizer_step_post_hook(self._on_opt_post)]
        try:
            self._set_discovery(True)
            instrument.install(self, self._patcher)
            if self.gpu:
                self.gpu_timer.install_sync_debug(self._patcher, self._on_cuda_sync)
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
        self._set_discovery(False, attach=False)
        self._patcher.restore()
        if self.gpu:
            self.gpu_timer.remove_sync_debug()
            self.gpu_timer.resolve(block=True)
        if self._sched_fd is not None:
            os.close(self._sched_fd)
            self._sched_fd = None
        active.current = None

    def runqueue_wait(self) -> int:
        """Nanoseconds this thread has waited for a CPU so far (0 where the kernel does not say)."""
        if self._sched_fd is None:
            return 0
        try:
            return int(os.pread(self._sched_fd, 64, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    # -- the phase stack ------------------------------------------------------------------------

    def on_main_thread(self) -> bool:
        return threading.get_ident() == self.thread

    @property
    def step_index(self) -> int:
        """The step an event now belongs to."""
        n = len(self.steps)
        if not self._expected and self.open_step.snapshot is not None and self._optimizer_delimits:
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
        if id(optimizer) in opened.stepped and opened.snapshot is not None and self._optimizer_delimits:
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
        if not self._optimizer_delimits:
            return
        if expected and expected <= opened.stepped:
            self._close(now)
            return
        # The step may go on (another optimizer) or may have ended (known at the next optimizer step).
        opened.snapshot = (now, dict(opened.acc), opened.forwards, opened.backwards, opened.opt_steps,
                           len(opened.marks), list(opened.pending_eval_grad), opened.module_calls)

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
    def _optimizer_delimits(self) -> bool:
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
            self._trained_ids = None  # trained now means "has trainable parameters"
            self._trained_cache.clear()
            log.info("turbotrain doctor: no optimizer step after %d backward(s): steps are delimited by "
                     "loss.backward()", self._backwards_unstepped)
        if self._pending_update:  # two backwards in a row (a second loss): the update comes after the last
            self.pop()
        self._pending_update = True
        self.push("update")

    def step_starts(self) -> None:
        """A data fetch or a training forward: in backward-delimited steps, the previous step ends here."""
        if not self._pending_update:
            return
        self._pending_update = False
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
        record = self._record(opened, now, opened.acc, opened.forwards, opened.backwards, opened.opt_steps,
                              opened.marks, opened.pending_eval_grad, opened.module_calls)
        self._expected = set(opened.stepped)
        self.open_step = fresh = _OpenStep(now)
        self._finish_step(record)
        if self.open_step is fresh and not fresh.acc:
            fresh.start = perf_counter()  # the doctor's own bookkeeping above is not the next step's time

    def _close_lazily(self) -> None:
        opened = self.open_step
        t, acc, forwards, backwards, opt_steps, n_marks, pending, calls = opened.snapshot
        record = self._record(opened, t, acc, forwards, backwards, opt_steps, opened.marks[:n_marks], pending,
                              calls)
        self._expected = set(opened.stepped)
        rest = _OpenStep(t, {k: v - acc.get(k, 0.0) for k, v in opened.acc.items()})
        rest.marks = opened.marks[n_marks:]
        rest.forwards, rest.backwards = opened.forwards - forwards, opened.backwards - backwards
        rest.module_calls = opened.module_calls - calls
        rest.pending_eval_grad = opened.pending_eval_grad[len(pending):]
        self.open_step = rest
        self._finish_step(record)

    def _record(self, opened: _OpenStep, end: float, acc: dict, forwards: int, backwards: int, opt_steps: int,
                marks: list, pending: list, module_calls: int) -> StepRecord:
        index = len(self.steps)
        for site, seconds in pending:  # eval-mode forwards with autograd on that no backward used
            tally = self.tally("eval_grad_forward", site)
            if tally is not None:
                tally.add(index, seconds)
        gap = 0.0
        if marks:
            t, timed = marks[0]
            gap = max(0.0, (t - opened.start) - timed)
        return StepRecord(index=index, start=opened.start, end=end, phases={k: v for k, v in acc.items() if v},
                          gap_before_forward=gap, forwards=forwards, backwards=backwards, optimizers=opt_steps,
                          module_calls=module_calls, profiled=self.profiling,
                          preempted=self._preemption(end - opened.start))

    def _preemption(self, duration: float) -> float | None:
        """Seconds this step waited for a CPU that another process held (None: the kernel does not say).

        The kernel's counter is read only for a step that ran long (over 1.5x the fastest of the
        last few steps): reading it costs microseconds, and a step that did not run long lost
        nothing worth taking out.
        """
        if self._sched_fd is None:
            return None
        recent = self._recent
        recent.append(duration)
        if len(recent) > 8:
            del recent[0]
        self._since_read += 1
        if len(recent) > 1 and duration <= 1.5 * min(recent) + 2e-4:
            if self._since_read >= 64:  # refresh the baseline now and then, charging nobody
                self._last_wait, self._since_read = self.runqueue_wait(), 0
            return 0.0
        now = self.runqueue_wait()
        waited = max(0, now - self._last_wait) / 1e9
        self._last_wait, self._since_read = now, 0
        return min(waited, duration)

    # A window holding a single occurrence of periodic work (validation every N steps) is extended until
    # the second one shows its period, within these bounds.
    MAX_EXTENSION_FACTOR = 4
    MAX_EXTENSION_S = 60.0

    def _extend_for_period(self, done: int) -> bool:
        """At the window's end: one more step when periodic work was seen once and its period is unknown."""
        from .breakdown import find_periodic

        if self._extension_started is None:
            self._extension_started, self._extension_limit = perf_counter(), self.MAX_EXTENSION_FACTOR * self.measure
        if done - self.warmup - self._measure_asked >= self._extension_limit or \
                perf_counter() - self._extension_started > self.MAX_EXTENSION_S:
            return False
        recent = self.steps[self.warmup:]
        ordinary = statistics.median(s.duration for s in recent) if recent else 0.0
        # Only validation/checkpoints (outside the step) big enough to move the verdict: under 5% of the
        # window spread over it, its period does not matter.
        seen_once = [p for p in find_periodic(self.steps) if p.every is None and p.category == "outside_step"
                     and p.cost_s >= 0.05 * len(recent) * ordinary]
        if not seen_once:
            return False
        self.measure += 1
        self.profile_at += 1
        if self.stop_after is not None:
            self.stop_after += 1
        return True

    def _finish_step(self, record: StepRecord) -> None:
        self.steps.append(record)
        if self.gpu:
            self.gpu_timer.resolve(block=False)
        done = len(self.steps)
        if self.measure is not None and done == self.warmup + self.measure and not self.profiling:
            self._extend_for_period(done)
        if done == max(1, self.warmup - 1):
            self.module_calls_per_step = record.module_calls  # counted under the global hooks
            self._set_discovery(False)
        if done == self.warmup:
            self.reads_at_start = data_stats.snapshot()
            self.functions.trace(False)
            self.load_start, self.threads_seen = sample_load(), torch.get_num_threads()
        if self.measure is not None and done == self.warmup + self.measure:
            self.reads_at_end = data_stats.snapshot()
            self.load_end = sample_load()
        if done == self.warmup and record.gap_before_forward > max(0.1 * record.duration, GAP_WORTH_SAMPLING_S):
            # The script builds batches itself, untimed: find which line. The sampler costs GIL
            # traffic (on a loaded machine, a descheduled sampler holding the GIL stalls the script,
            # inside the very gap it samples), so only a gap worth a finding gets it.
            self._sampler = GapSampler(self)
            self._sampler.start()
        if self.measure is not None and done == self.warmup + self.measure and self._sampler is not None:
            self._sampler.stop()
        if self.profile_steps and done == self.profile_at:
            self.functions.trace(True)
            self._start_profiler()
        elif self.profiling:
            if done >= self.profile_at + self.profile_steps:
                self._stop_profiler()
            else:
                self.profiled_steps.append(done)
                self.window.open_step_range(done)
        if self.stop_after is not None and done >= self.stop_after:
            self._stopping = True
            raise Stop()

    # -- modules: the outermost calls of a step ----------------------------------------------------

    def _set_discovery(self, on: bool, attach: bool = True) -> None:
        """Global module hooks (find the outermost modules), or a light wrapper on just those modules.

        Global hooks slow every module call (and any hook sends a module down torch's slow call
        path), so they run only in the first warm-up steps. After that, the outermost modules'
        classes get a ``__call__`` that checks for those very instances: a training forward just
        marks where the batch was ready (its time is compute, like the rest of the step after it);
        a validation forward is timed apart. The classes are restored when the recording ends
        (instances, copies and pickles never carry anything of the doctor's).
        """
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        for handle in getattr(self, "_module_handles", []):
            handle.remove()
        self._module_handles: list[Any] = []
        self.discovery = on
        if on:
            self._module_handles = [
                register_module_forward_pre_hook(self._forward_pre),
                register_module_forward_hook(self._forward_post, always_call=True),
            ]
        elif attach:
            for ref in self.top_modules.values():
                module = ref()
                if module is None:
                    continue
                self.top_ids.add(id(module))
                cls = type(module)
                if cls not in self._wrapped_classes:
                    self._wrapped_classes.add(cls)
                    self._patcher.replace(cls, "__call__", instrument.measured_call)
        self._depth = 0
        self._top_phases.clear()

    def _forward_pre(self, module: nn.Module, args: tuple) -> None:
        if self.discovery:
            self.open_step.module_calls += 1
        self._forward_enter(module, args, None)

    def _classify(self, module: nn.Module) -> tuple[str, bool]:
        trained = self.is_trained(module)
        if trained and (not torch.is_grad_enabled() or torch.is_inference_mode_enabled()):
            return "eval", trained
        if trained and not module.training:
            return "eval_grad", trained
        return "forward", trained

    def _training_forward(self, module: nn.Module, args: tuple, kwargs: dict | None, at: float) -> None:
        opened = self.open_step
        if not opened.marks:
            opened.marks.append((at, self.timed_so_far()))
        opened.forwards += 1
        if self.gpu and not self._gpu_forward_open:
            self.gpu_mark("forward", start=True)
            self._gpu_forward_open = True
        # Facts and a captured batch: first seen at once (a script may end early), then again in
        # the last warm-up step (under the hooks the measured steps use, which also see kwargs).
        # Not under the global hooks of discovery: those do not see keyword arguments (model(**batch)).
        late = self.step_index >= self.warmup - 1 and not self.discovery
        if self.facts is None or (not self._facts_final and late):
            self._facts_final = late
            self.facts = forward_facts(module, args, kwargs)
        if self.want_capture and (self.capture is None or (not self._capture_final and late)):
            self._capture_final = late
            captured = capture_inputs(module, args, kwargs, self.facts, user_site(sys._getframe(1)))
            self.capture = captured or self.capture

    def call_enter(self, module: nn.Module, args: tuple, kwargs: dict) -> str | None:
        """An outermost module is called (measured steps): the phase to time it as, or None."""
        phase, trained = self._classify(module)
        if self._pending_update and phase == "forward" and trained:
            self.step_starts()
        # A forward inside another timed phase (Lightning runs it in optimizer.step's closure) is
        # timed itself; otherwise its time is the untimed compute after the mark.
        if phase == "forward" and not self.profiling and not self.stack:
            if trained:
                self._training_forward(module, args, kwargs, perf_counter())
            self._last_top_phase = "forward"
            return None
        if phase == "eval":
            self._note_forward_site("eval_forward")
        self.push(phase)  # a validation forward, or any forward in the profiler window (its trace range)
        if phase == "forward" and trained:
            self._training_forward(module, args, kwargs, self.stack[-1][1])
        return phase

    def call_exit(self, phase: str) -> None:
        seconds = self.pop()
        if phase == "eval_grad":
            self.open_step.pending_eval_grad.append((user_site(sys._getframe(2)), seconds))
        self._last_top_phase = phase

    def _forward_enter(self, module: nn.Module, args: tuple, kwargs: dict | None) -> None:
        if active.current is not self or get_ident() != self.thread or active.compiling():
            return
        self._depth += 1
        if self._depth != 1:
            return
        self.top_modules.setdefault(id(module), weakref.ref(module))
        phase, trained = self._classify(module)
        if self._pending_update and phase == "forward" and trained:
            self.step_starts()
        if phase == "eval":
            self._note_forward_site("eval_forward")
        self.push(phase)
        self._top_phases.append(phase)
        if phase == "forward" and trained:
            self._training_forward(module, args, kwargs, self.stack[-1][1])

    def _forward_post(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self._depth == 0 or get_ident() != self.thread or active.compiling():
            return
        self._depth -= 1
        if self._depth != 0 or not self._top_phases:
            return
        phase = self._top_phases.pop()
        seconds = self.pop()
        if phase == "eval_grad":
            self.open_step.pending_eval_grad.append((user_site(sys._getframe(1)), seconds))
        self._last_top_phase = phase

    def _note_forward_site(self, kind: str) -> None:
        tally = self.tally(kind, user_site(sys._getframe(1)))
        if tally is not None:
            tally.add(self.step_index)

    def on_backward(self) -> None:
        """Called at the start of a backward: an eval-mode forward just before it was training after all."""
        opened = self.open_step
        opened.backwards += 1
        if self._gpu_forward_open:
            self.gpu_mark("forward", start=False)
            self._gpu_forward_open = False
        if self._last_top_phase == "eval_grad" and opened.pending_eval_grad:
            _, seconds = opened.pending_eval_grad.pop()
            opened.acc["eval_grad"] -= seconds
            opened.acc["forward"] += seconds
        self._last_top_phase = "backward"

    def is_trained(self, module: nn.Module) -> bool:
        key = id(module)
        cached = self._trained_cache.get(key)
        if cached is not None:
            return cached
        if self._trained_ids is None:
            self._trained_ids = {id(p) for ref, _ in self.optimizers if ref() is not None
                                 for group in ref().param_groups for p in group["params"]}
        if self._trained_ids or self._optimizer_delimits:
            trained = any(id(p) in self._trained_ids for p in module.parameters())
        else:  # weights updated by hand: the model is whatever has trainable parameters
            trained = any(p.requires_grad for p in module.parameters())
        self._trained_cache[key] = trained
        return trained

    def note_optimizer(self, optimizer: Any, site: Site | None) -> None:
        if id(optimizer) not in self._optimizer_ids:
            self._optimizer_ids.add(id(optimizer))
            self.optimizers.append((weakref.ref(optimizer), site))
        self._trained_ids = None
        self._trained_cache.clear()

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
