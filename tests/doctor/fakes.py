"""Stand-ins for driving the recorder by hand: a clock the test moves, an optimizer with nothing to step."""

from __future__ import annotations


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def tick(self, seconds: float) -> None:
        self.t += seconds


class FakeOptimizer:
    param_groups: list = []
