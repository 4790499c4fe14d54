"""turbotrain: make PyTorch training fast, and prove it.

import turbotrain as tt
plan = tt.Plan.fast(model)                     # or tt.Plan(precision="bf16-mixed", ...)
result = tt.Trainer(model, optimizer, loss_fn, plan=plan, max_epochs=3).fit(train_loader, val_loader)
plan = tt.tune(model, loss_fn, train_loader, optimizer_fn, time_budget_s=120)   # measured, not by rule

Every name below is imported on first use: ``import turbotrain`` alone, as the command line does before it
knows what it will run, imports no torch.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ._lazy import lazy
from .config import ConfigError

if TYPE_CHECKING:
    from . import data, doctor
    from .own_loop import setup
    from .plan import Plan
    from .runtime import Runtime, prepare
    from .train.checkpoint import CheckpointError
    from .train.early_stopping import EarlyStopping
    from .train.nonfinite import NonFiniteError
    from .train.preemption import PREEMPTED_EXIT_CODE, Preempted
    from .train.trainer import FitResult, Trainer
    from .tuning import tune  # tt.tune: the tuner, a function; its package is turbotrain.tuning

__version__ = "0.1.0"

__getattr__, __dir__ = lazy(
    globals(),
    {
        "Plan": ".plan",
        "Trainer": ".train.trainer",
        "FitResult": ".train.trainer",
        "EarlyStopping": ".train.early_stopping",
        "setup": ".own_loop",
        "prepare": ".runtime",
        "Runtime": ".runtime",
        "CheckpointError": ".train.checkpoint",
        "NonFiniteError": ".train.nonfinite",
        "Preempted": ".train.preemption",
        "PREEMPTED_EXIT_CODE": ".train.preemption",
        "tune": ".tuning",
    },
    submodules=("data", "doctor"),
)

__all__ = [
    "Plan",
    "Trainer",
    "FitResult",
    "EarlyStopping",
    "setup",
    "prepare",
    "Runtime",
    "ConfigError",
    "CheckpointError",
    "NonFiniteError",
    "Preempted",
    "PREEMPTED_EXIT_CODE",
    "data",
    "doctor",
    "tune",
    "__version__",
]

logging.getLogger("turbotrain").addHandler(logging.NullHandler())
