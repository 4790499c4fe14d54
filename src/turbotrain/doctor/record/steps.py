"""Where one training step ends and the next begins, whatever the loop looks like.

Steps end at the optimizer (global step hooks: one optimizer or several, a step is over when every optimizer
that stepped in the last one has stepped again); without an optimizer, at ``loss.backward()`` (what follows it
until the next data fetch or training forward is the hand-written update); or at ``watch.step()``.
Each closed step becomes a :class:`~turbotrain.doctor.record.measurements.StepRecord` handed to ``on_closed``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .open_step import Closed, OpenStep
from .measurements import Phase, StepRecord
from .clock import PhaseClock
from .tallies import Tallies

__all__ = ["Stop", "StepTracker"]

log = logging.getLogger("turbotrain")


class Stop(BaseException):
    """Ends the user's script once enough steps were measured (a BaseException, so ``except Exception`` in the
    script does not swallow it)."""


class StepTracker:
    """The open step, the closed ones, and the boundary between them."""

    # Backwards before a script that built optimizers is taken to update weights by hand: gradient
    # accumulation over more micro-batches than this is rare (nanoGPT's default is 40).
    BACKWARDS_WITHOUT_STEP = 64

    def __init__(
        self,
        clock: PhaseClock,
        tallies: Tallies,
        on_closed: Callable[[StepRecord], None],
        sees_construction: bool = False,
    ) -> None:
        self.clock, self.tallies, self.on_closed = clock, tallies, on_closed
        self.steps: list[StepRecord] = []
        # Steps closed so far. Equal to len(steps) until the window ends; after it, steps the watch of the
        # whole run's step clock takes (:mod:`.watch`) are closed and counted but not kept here.
        self.closed = 0
        self.watching = False
        self.open_step = OpenStep(clock.now())
        clock.acc = self.open_step.acc
        self.manual_steps = False  # steps marked by mark_step(), not by optimizers
        # Steps delimited by loss.backward(): no optimizer ever stepped (a hand-written update). With
        # ``sees_construction`` (installed before the script ran) a script that built no optimizer is
        # known at its first backward; otherwise a known optimizer may still step after accumulating.
        self.backward_steps = False
        self.sees_construction = sees_construction
        self.pending_update = False  # a backward ended; the step closes when the next one starts
        self.stopping = False  # the window is over: the next boundary ends the script
        self.profiling = False  # steps closed now ran under torch.profiler
        self.preempted: Callable[[float], float | None] = lambda seconds: None
        self.gpu_mark: Callable[[Phase, bool], None] | None = None
        self.on_trained_changed: Callable[[], None] = lambda: None
        self.thread = threading.get_ident()
        # Held until the report is built: the script's namespace (and its last reference) goes when the doctor
        # ends it, and the optimizer rules and what-ifs read these objects after.
        self.kept_optimizers: dict[int, Any] = {}
        self._backwards_unstepped = 0
        self._optimizer_stepped = False
        self._expected: set[int] = set()  # the optimizers that stepped in the last step

    def restart(self) -> None:
        """The recording starts now: the first step opens here."""
        self.thread = threading.get_ident()
        self.open_step = OpenStep(self.clock.now())
        self.clock.acc = self.open_step.acc

    @property
    def step_index(self) -> int:
        """The step an event now belongs to."""
        n = self.closed
        if not self._expected and self.open_step.snapshot is not None and self.optimizer_delimits:
            # The first step ends at its last optimizer step, which is only known when an optimizer
            # steps a second time; until then, what follows an optimizer step counts as the next step.
            return n + 1
        return n

    @property
    def optimizer_delimits(self) -> bool:
        return not (self.manual_steps or self.backward_steps)

    @property
    def delimiter(self) -> str:
        if self.manual_steps:
            return "watch.step()"
        return "loss.backward()" if self.backward_steps else "optimizer.step()"

    # -- optimizer steps --------------------------------------------------------------------------

    def optimizer_created(self, optimizer: Any, site: Any) -> None:
        self.tallies.note_optimizer(optimizer, site)
        self.on_trained_changed()

    # The optimizer's global step hooks call these with the step's (args, kwargs), unused here.
    def before_optimizer_step(self, optimizer: Any, args: object = None, kwargs: object = None) -> None:
        if threading.get_ident() != self.thread:
            return
        if self.stopping:
            raise Stop()
        if id(optimizer) not in self.tallies.optimizer_ids:
            self.optimizer_created(optimizer, None)
        self._optimizer_stepped = True
        self.kept_optimizers.setdefault(id(optimizer), optimizer)
        opened = self.open_step
        if id(optimizer) in opened.stepped and opened.snapshot is not None and self.optimizer_delimits:
            # This optimizer already stepped since the last boundary: the previous step ended at
            # the last optimizer step (a loop with several optimizers, first steps).
            self._close_at_snapshot()
        self.clock.push("optimizer")
        self.open_step.stepped.add(id(optimizer))
        if self.gpu_mark is not None:
            self.gpu_mark("optimizer", True)

    def after_optimizer_step(self, optimizer: Any, args: object = None, kwargs: object = None) -> None:
        if threading.get_ident() != self.thread:
            return
        if self.gpu_mark is not None:
            self.gpu_mark("optimizer", False)
        self.clock.pop()
        opened = self.open_step
        opened.opt_steps += 1
        now = self.clock.now()
        if not self.optimizer_delimits:
            return
        if self._expected and self._expected <= opened.stepped:
            self._close(now)
            return
        # The step may go on (another optimizer) or may have ended (known at the next optimizer step).
        opened.take_snapshot(now)

    # -- other delimiters -------------------------------------------------------------------------

    def mark_step(self) -> None:
        """End a step here (loops without a torch optimizer); optimizer steps no longer end steps."""
        if threading.get_ident() != self.thread:
            return
        if self.stopping:
            raise Stop()
        self.manual_steps = True
        self.open_step.opt_steps = max(self.open_step.opt_steps, 1)
        self._close(self.clock.now())

    def after_backward(self) -> None:
        """A backward ended. Without optimizer steps, it ends the step's compute: what follows until the
        next step starts (a data fetch or a training forward) is the hand-written update."""
        if self.manual_steps or self._optimizer_stepped:
            return
        if not self.backward_steps:
            self._backwards_unstepped += 1
            known = bool(self.tallies.optimizers) or not self.sees_construction
            if known and self._backwards_unstepped < self.BACKWARDS_WITHOUT_STEP:
                return
            self.backward_steps = True
            self.on_trained_changed()  # trained now means "has trainable parameters"
            log.info(
                "turbotrain doctor: no optimizer step after %d backward(s): steps are delimited by loss.backward()",
                self._backwards_unstepped,
            )
        if self.pending_update:  # two backwards in a row (a second loss): the update comes after the last
            self.clock.pop()
        self.pending_update = True
        self.clock.push("update")

    def step_starts(self) -> None:
        """A data fetch or a training forward: in backward-delimited steps, the previous step ends here."""
        if not self.pending_update:
            return
        self.pending_update = False
        clock = self.clock
        while clock.frames and clock.frames[-1].phase != "update":
            clock.pop()  # defensive: phases opened inside the update (never left open by the wrappers)
        if clock.frames:
            clock.pop()
        self.open_step.opt_steps = max(self.open_step.opt_steps, 1)
        self._close(clock.now())

    # -- closing ----------------------------------------------------------------------------------

    def _close(self, now: float) -> None:
        opened = self.open_step
        fresh = OpenStep(now)
        self.clock.cut(now, fresh.acc)  # a phase still running (a step inside a forward) is split here
        record = self._record(opened.start, opened.closed_at(now))
        self._expected = set(opened.stepped)
        self.open_step = fresh
        self.on_closed(record)
        if self.open_step is fresh and not fresh.acc:
            fresh.start = self.clock.now()  # the doctor's own bookkeeping above is not the next step's time

    def _close_at_snapshot(self) -> None:
        opened = self.open_step
        done, rest = opened.split()
        record = self._record(opened.start, done)
        self._expected = set(opened.stepped)
        self.open_step = rest
        self.clock.acc = rest.acc
        self.on_closed(record)

    def _record(self, start: float, done: Closed) -> StepRecord:
        index = self.closed
        for site, seconds in done.pending_eval_grad:  # eval-mode forwards with autograd on that no backward used
            tally = self.tallies.tally("eval_grad_forward", site)
            if tally is not None:
                tally.add(index, seconds)
        gap = 0.0
        if done.marks:
            t, timed = done.marks[0]
            gap = max(0.0, (t - start) - timed)
        record = StepRecord(
            index=index,
            start=start,
            end=done.end,
            phases={k: v for k, v in done.acc.items() if v},
            gap_before_forward=gap,
            forwards=done.forwards,
            backwards=done.backwards,
            optimizers=done.opt_steps,
            module_calls=done.module_calls,
            profiled=self.profiling,
            preempted=self.preempted(done.end - start),
        )
        self.closed += 1
        if not self.watching:
            self.steps.append(record)
        return record
