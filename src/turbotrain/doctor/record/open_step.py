"""The step in progress: what each phase has cost so far, and where it may have ended.

With several optimizers (or one optimizer stepping once per micro-batch group), the end of a step
is only known when an optimizer steps a second time: each optimizer step takes a snapshot, and the
step is then split at the last snapshot (:meth:`OpenStep.split`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from .measurements import Phase
from ..sites import Site

__all__ = ["OpenStep", "Closed"]


class Closed(NamedTuple):
    """What a finished step accumulated, up to ``end``."""

    end: float
    acc: dict[Phase, float]
    forwards: int
    backwards: int
    opt_steps: int
    marks: list[tuple[float, float]]
    pending_eval_grad: list[tuple[Site | None, float]]
    module_calls: int


class OpenStep:
    """Accumulators of the step in progress (and a snapshot at its last optimizer step)."""

    __slots__ = (
        "start",
        "acc",
        "marks",
        "forwards",
        "backwards",
        "opt_steps",
        "stepped",
        "snapshot",
        "pending_eval_grad",
        "module_calls",
    )

    def __init__(self, start: float, acc: dict[Phase, float] | None = None) -> None:
        self.start = start
        self.acc: dict[Phase, float] = defaultdict(float, acc or {})
        self.marks: list[tuple[float, float]] = []  # (time, timed seconds so far) at each training forward
        self.forwards = self.backwards = self.opt_steps = self.module_calls = 0
        self.stepped: set[int] = set()  # ids of the optimizers that stepped in it
        self.snapshot: Closed | None = None
        self.pending_eval_grad: list[tuple[Site | None, float]] = []

    def closed_at(self, end: float) -> Closed:
        """Everything up to now: the step ends here."""
        return Closed(
            end,
            self.acc,
            self.forwards,
            self.backwards,
            self.opt_steps,
            self.marks,
            self.pending_eval_grad,
            self.module_calls,
        )

    def take_snapshot(self, now: float) -> None:
        """An optimizer just stepped: the step may end here (known when an optimizer steps again)."""
        self.snapshot = Closed(
            now,
            dict(self.acc),
            self.forwards,
            self.backwards,
            self.opt_steps,
            list(self.marks),
            list(self.pending_eval_grad),
            self.module_calls,
        )

    def split(self) -> tuple[Closed, "OpenStep"]:
        """The step as it was at the snapshot, and what came after it as the next open step."""
        done = self.snapshot
        assert done is not None
        rest = OpenStep(done.end, {k: v - done.acc.get(k, 0.0) for k, v in self.acc.items()})
        rest.marks = self.marks[len(done.marks) :]
        rest.forwards, rest.backwards = self.forwards - done.forwards, self.backwards - done.backwards
        rest.module_calls = self.module_calls - done.module_calls
        rest.pending_eval_grad = self.pending_eval_grad[len(done.pending_eval_grad) :]
        return done, rest
