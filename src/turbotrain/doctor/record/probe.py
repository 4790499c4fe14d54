"""What the wrappers installed around torch see of a recording: the clock, the tallies, the step tracker.

The wrappers find it through :mod:`turbotrain.doctor.record.active` on every call, so its fields are plain attributes
read on the hot path; it holds no reference to the Recorder that made it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .clock import PhaseClock
from .measurements import Phase
from .steps import StepTracker
from .tallies import Tallies

if TYPE_CHECKING:
    from .discovery import ModuleCalls
    from .schedule import StepSchedule

__all__ = ["Probe", "no_device_marks"]


def no_device_marks(phase: Phase, start: bool) -> None:
    """Without a GPU there are no device events to mark."""


@dataclass(slots=True, eq=False)
class Probe:
    clock: PhaseClock
    tallies: Tallies
    steps: StepTracker
    schedule: StepSchedule  # which steps are warm-up (discovery captures the batch in the last one)
    thread: int  # the script's thread: other threads are not the training loop
    gpu: bool
    busy: bool = False  # inside a recorded call: the calls it makes itself are not the user's
    profiling: bool = False  # the profiler window is open: every phase is pushed (its range), none left untimed
    # CUDA events around a phase of a measured step.
    gpu_mark: Callable[[Phase, bool], None] = no_device_marks
    modules: ModuleCalls = field(init=False)  # the outermost module calls, made with this probe
