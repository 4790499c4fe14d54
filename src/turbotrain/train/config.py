"""The Trainer's limits and cadences, as a strict dataclass (unknown keys are errors)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from ..config import ConfigError, strict

__all__ = ["TrainerConfig", "parse_duration"]


def parse_duration(value: float | str | None) -> float | None:
    """Seconds from a number or a 'DD:HH:MM:SS' / 'HH:MM:SS' / 'MM:SS' string."""
    if value is None or isinstance(value, (int, float)):
        return None if value is None else float(value)
    if not re.fullmatch(r"\d+(:\d+){0,3}", value):
        raise ConfigError(f"max_time: {value!r} is not a duration; use seconds or 'DD:HH:MM:SS'.")
    seconds = 0.0
    for part, unit in zip(reversed(value.split(":")), (1, 60, 3600, 86400)):
        seconds += int(part) * unit
    return seconds


@strict
@dataclass(frozen=True)
class TrainerConfig:
    max_epochs: int | None = None
    """Stop after this many epochs (1 when no other limit is given)."""
    min_epochs: int = 0
    """Early stopping cannot stop before this many epochs."""
    max_steps: int | None = None
    """Stop after this many optimizer steps."""
    min_steps: int = 0
    max_time: float | str | None = None
    """Wall-clock limit: seconds or 'DD:HH:MM:SS'."""
    check_val_every_n_epoch: int = 1
    val_check_interval: int | float | None = None
    """Validate every fraction of an epoch (0.25) or every N optimizer steps (200)."""
    limit_val_batches: int | None = None
    log_every_n_steps: int = 50
    checkpoint_dir: str | None = None
    checkpoint_every_n_steps: int | None = None
    checkpoint_every_n_epochs: int | None = None
    keep_checkpoints: int = 3
    log_dir: str | None = None
    loggers: tuple[Literal["csv", "tensorboard"], ...] = ("csv",)
    progress: bool | Literal["auto"] = "auto"
    gradient_clip_val: float | None = None
    on_nonfinite: Literal["stop", "skip", "ignore"] = "stop"
    """'stop' before a NaN/inf reaches the weights, 'skip' such steps, or 'ignore' (no check, as plain PyTorch)."""
    manual_optimization: bool = False
    scheduler_interval: Literal["step", "epoch"] = "step"
    warmup_steps: int = 3
    """Steps left out of the reported throughput (compile, allocator and cache warm-up)."""

    def _check(self) -> None:
        for name in (
            "max_epochs",
            "max_steps",
            "log_every_n_steps",
            "check_val_every_n_epoch",
            "checkpoint_every_n_steps",
            "checkpoint_every_n_epochs",
            "limit_val_batches",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"TrainerConfig.{name}: {value} is not allowed; expected an integer >= 1.")
        for name in ("min_epochs", "min_steps", "warmup_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"TrainerConfig.{name}: must be >= 0, got {getattr(self, name)}.")
        v = self.val_check_interval
        if isinstance(v, float) and not 0.0 < v <= 1.0:
            raise ConfigError(
                f"TrainerConfig.val_check_interval: {v} is not allowed; a fraction must be in (0, 1], "
                "an integer counts optimizer steps."
            )
        if isinstance(v, int) and v < 1:
            raise ConfigError(f"TrainerConfig.val_check_interval: {v} is not allowed; expected >= 1 steps.")
        if self.checkpoint_every_n_steps is not None and self.checkpoint_dir is None:
            raise ConfigError(
                "TrainerConfig.checkpoint_every_n_steps: checkpoints need checkpoint_dir, the directory to write "
                "them to."
            )
        seconds = parse_duration(self.max_time)
        if seconds is not None and not 0 < seconds < math.inf:  # NaN included: it would mean no limit
            raise ConfigError(
                f"TrainerConfig.max_time: {self.max_time!r} is not allowed; expected a duration > 0 (seconds or "
                "'DD:HH:MM:SS'), or null for no limit."
            )
        for name in ("checkpoint_dir", "log_dir"):
            if getattr(self, name) == "":  # Path("") is the working folder: files would land wherever one runs
                raise ConfigError(f"TrainerConfig.{name}: '' is not allowed; name a folder, or null for none.")
        if self.gradient_clip_val is not None and not self.gradient_clip_val > 0:  # NaN included
            raise ConfigError(f"TrainerConfig.gradient_clip_val: {self.gradient_clip_val} is not allowed; must be > 0.")

    @property
    def max_time_s(self) -> float | None:
        return parse_duration(self.max_time)
