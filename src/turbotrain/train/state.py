"""The Trainer's state, each kind declared once: what lasts across fit() calls and goes into
checkpoints (``TrainState``), what one fit() call creates (``FitState``), what it returns (``FitResult``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from ..config import ConfigError
from ..plan import Plan
from .config import TrainerConfig
from .loggers import make_loggers
from .meters import LossMeter, ThroughputClock
from .preemption import SignalWatch
from .progress import make_progress
from .resumable import EpochSource

__all__ = ["TrainState", "FitState", "FitResult"]


@dataclass
class TrainState:
    """Where training is: saved in every checkpoint, restored by ``fit(resume=True)``."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # current epoch (0-based)
    batches_done: int = 0  # micro-batches consumed in the current epoch
    samples: int = 0
    skipped_steps: int = 0
    elapsed_s: float = 0.0  # wall time of earlier (resumed-from) runs
    early_stop: bool = False  # EarlyStopping asked to stop (honoured once min_epochs/min_steps are done)
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FitState:
    """Everything one ``fit()`` call creates: its data, limits, meters and outputs, and why it stopped.

    Made at the start of ``fit`` (after a resume) and kept after it, so that ``validate()`` and
    ``state_dict()`` called after ``fit`` see the loaders it trained with.
    """

    source: EpochSource  # the training batches, epoch by epoch, resumable mid-epoch
    val_loader: Iterable | None
    max_epochs: int | None  # None: max_steps or max_time ends training
    epoch_len: int | None  # micro-batches per epoch; None for a loader without a length
    steps_per_epoch: int | None  # optimizer steps per epoch
    val_every: int | None  # validate every this many steps (None: at epoch ends)
    step_limit: float  # max_steps, or infinity: one comparison per step either way
    deadline: float | None  # time.monotonic() at which max_time runs out
    started: float  # time.monotonic() from which this fit's time is counted
    clock: ThroughputClock
    loss_meter: LossMeter
    loggers: list
    progress: Any  # train.progress: a line, a rich bar, or nothing
    signals: SignalWatch = field(default_factory=SignalWatch)
    next_event: int = 0  # the next step with a log, validation, checkpoint or the warm-up's end
    stop_reason: str | None = None

    @classmethod
    def start(
        cls,
        cfg: TrainerConfig,
        state: TrainState,
        source: EpochSource,
        val_loader: Iterable | None,
        device: torch.device,
        accum_steps: int,
        on_rank_zero: bool,
    ) -> "FitState":
        """A fit's state as it begins at ``state`` (a fresh one, or the one resumed from a checkpoint)."""
        max_epochs = cfg.max_epochs or (None if (cfg.max_steps or cfg.max_time) else 1)
        epoch_len = len(source) if source.has_length else None
        steps_per_epoch = math.ceil(epoch_len / accum_steps) if epoch_len else None
        now = time.monotonic()
        return cls(
            source=source,
            val_loader=val_loader,
            max_epochs=max_epochs,
            epoch_len=epoch_len,
            steps_per_epoch=steps_per_epoch,
            val_every=_val_interval_steps(cfg, steps_per_epoch),
            step_limit=cfg.max_steps if cfg.max_steps is not None else math.inf,
            deadline=None if cfg.max_time_s is None else now + cfg.max_time_s - state.elapsed_s,
            started=now,
            clock=ThroughputClock(device, cfg.warmup_steps, state.step, state.samples),
            loss_meter=LossMeter(device),
            loggers=make_loggers(cfg.log_dir, cfg.loggers) if on_rank_zero else [],
            progress=make_progress(cfg.progress, _total_steps(cfg, max_epochs, steps_per_epoch), enabled=on_rank_zero),
        )


def _val_interval_steps(cfg: TrainerConfig, steps_per_epoch: int | None) -> int | None:
    """``val_check_interval`` in optimizer steps: as given, or a fraction of an epoch; None: at epoch ends."""
    v = cfg.val_check_interval
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v < 1.0:
        if steps_per_epoch is None:
            raise ConfigError(
                "Trainer.val_check_interval: a fraction of an epoch needs a loader with a length; "
                "give a number of steps instead."
            )
        return max(1, round(steps_per_epoch * v))
    return None


def _total_steps(cfg: TrainerConfig, max_epochs: int | None, steps_per_epoch: int | None) -> int | None:
    """The steps the progress bar counts to: the nearer of max_steps and max_epochs; None when neither is known."""
    candidates = [cfg.max_steps] if cfg.max_steps else []
    if max_epochs and steps_per_epoch:
        candidates.append(max_epochs * steps_per_epoch)
    return min(candidates) if candidates else None


@dataclass
class FitResult:
    """What ``fit`` returns: where training ended and how fast it ran."""

    steps: int
    epochs: int
    samples: int
    samples_per_s: float  # steady state: after warm-up, without validation and checkpoints
    train_time_s: float
    metrics: dict[str, float]  # the last value of every logged metric
    history: list[dict[str, Any]]
    stopped_by: str
    skipped_steps: int
    checkpoint: str | None
    plan: Plan
    applied: list[str]
    skipped: list[tuple[str, str]]
