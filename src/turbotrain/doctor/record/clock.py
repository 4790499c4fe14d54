"""The phase clock: a stack of named frames that charges every moment of a step to its innermost phase.

A wrapper pushes a phase when a timed call starts (``data``, ``forward``, ``sync``, ...) and pops it when the
call returns; the time a nested phase runs is not its parent's, so the phases of a step add up without double
counting. The seconds go to ``acc``, the accumulators of the step in progress, which the step tracker swaps
when a step ends. Time is read from ``now`` (a fake clock in unit tests).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from .measurements import Phase

__all__ = ["Frame", "PhaseClock", "Spans"]


class Spans(Protocol):
    """Named ranges a profiler shows around each phase (torch.profiler's record_function, NVTX on CUDA)."""

    def open(self, phase: Phase) -> object: ...

    def close(self, span: object) -> None: ...


@dataclass(slots=True)
class Frame:
    """One phase in progress."""

    phase: Phase
    running_since: float  # when its own time last resumed (it pauses while a nested phase runs)
    own_s: float = 0.0  # its own seconds so far in this step
    span: object = None  # the profiler range around it, while profiling


class PhaseClock:
    """``push``/``pop`` phases; ``timed_so_far`` of the open step; ``cut`` at a step boundary."""

    __slots__ = ("frames", "acc", "now", "spans")

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.frames: list[Frame] = []
        # Seconds per phase of the open step (a defaultdict: the step tracker hands the open step's).
        self.acc: dict[Phase, float] = defaultdict(float)
        self.now = now
        self.spans: Spans | None = None  # set while a profiler window wants a range per phase

    @property
    def idle(self) -> bool:
        """No phase is running: the moment belongs to no timed call."""
        return not self.frames

    @property
    def top(self) -> Frame | None:
        return self.frames[-1] if self.frames else None

    def _flush(self, now: float) -> None:
        """Charge the running frame up to ``now``."""
        top = self.frames[-1]
        ran = now - top.running_since
        self.acc[top.phase] += ran
        top.own_s += ran
        top.running_since = now

    def push(self, phase: Phase) -> Frame:
        now = self.now()
        if self.frames:
            self._flush(now)
        frame = Frame(phase, now, 0.0, self.spans.open(phase) if self.spans is not None else None)
        self.frames.append(frame)
        return frame

    def pop(self, record_as: Phase | Literal[""] | None = "") -> float:
        """End the innermost phase and return its own seconds.

        ``record_as`` names the phase to charge instead (a copy that turned out to be a sync); None gives the
        time back to the enclosing phase (a ``.to(dtype)`` that copied nothing).
        """
        now = self.now()
        if not self.frames:
            return 0.0
        frame = self.frames.pop()
        if frame.span is not None and self.spans is not None:
            self.spans.close(frame.span)
        acc = self.acc
        last = now - frame.running_since
        own_total = frame.own_s + last
        if record_as is None:
            acc[frame.phase] -= frame.own_s
            if self.frames:
                acc[self.frames[-1].phase] += own_total
                self.frames[-1].own_s += own_total
        elif record_as and record_as != frame.phase:
            acc[frame.phase] -= frame.own_s
            acc[record_as] += own_total
        else:
            acc[frame.phase] += last
        if self.frames:
            self.frames[-1].running_since = now
        return own_total

    def timed_so_far(self) -> float:
        """Seconds of the open step charged to phases up to now (the running phase included)."""
        if self.frames:
            self._flush(self.now())
        return sum(self.acc.values())

    def recharge(self, from_phase: Phase, to_phase: Phase, seconds: float) -> None:
        """Move ``seconds`` of the open step from one phase to another (a forward found to be training)."""
        self.acc[from_phase] -= seconds
        self.acc[to_phase] += seconds

    def cut(self, now: float, acc: dict[Phase, float]) -> None:
        """A step ends at ``now`` while phases may still run: what they ran so far stays in the closed step,
        and from here on they charge ``acc``, the next step's accumulators."""
        if self.frames:
            self._flush(now)
            for frame in self.frames:
                frame.own_s = 0.0
        self.acc = acc

    def end_spans(self) -> None:
        """The profiler window ends: close the ranges of the phases still running."""
        if self.spans is not None:
            for frame in self.frames:
                if frame.span is not None:
                    self.spans.close(frame.span)
                    frame.span = None
        self.spans = None
