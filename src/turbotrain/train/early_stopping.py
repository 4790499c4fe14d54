"""Early stopping on a monitored metric (patience, mode, min_delta)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ..config import ConfigError, strict

__all__ = ["EarlyStopping"]


@strict
@dataclass
class EarlyStopping:
    monitor: str = "val_loss"
    patience: int = 3
    """Validation checks in a row without improvement that stop training (0: the first one)."""
    mode: Literal["min", "max"] = "min"
    min_delta: float = 0.0
    """The least change that counts as an improvement."""
    best: float | None = field(default=None)
    wait: int = field(default=0)

    def _check(self) -> None:
        if self.patience < 0 or self.min_delta < 0:
            raise ConfigError("EarlyStopping: patience and min_delta must be >= 0.")

    def improved(self, value: float) -> bool:
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, metrics: dict[str, float]) -> bool:
        """Record a validation result; True when training should stop."""
        if self.monitor not in metrics:
            raise KeyError(
                f"EarlyStopping monitors '{self.monitor}' but the metrics are {sorted(metrics)}; "
                f"set EarlyStopping(monitor=...) to one of them."
            )
        value = float(metrics[self.monitor])
        if math.isnan(value):
            self.wait += 1
        elif self.improved(value):
            self.best, self.wait = value, 0
        else:
            self.wait += 1
        return self.wait > 0 and self.wait >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "wait": self.wait}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.wait = state["best"], state["wait"]
