"""turbotrain: make PyTorch training fast, and prove it.

import turbotrain as tt
plan = tt.Plan.fast(model)                     # or tt.Plan(precision="bf16-mixed", ...)
result = tt.Trainer(model, optimizer, loss_fn, plan=plan, max_epochs=3).fit(train_loader, val_loader)
plan = tt.tune(model, loss_fn, train_loader, optimizer_fn, time_budget_s=120)   # measured, not by rule
"""

from __future__ import annotations

import logging

from . import data
from .config import ConfigError
from .plan import Plan
from .runtime import Runtime, prepare
from .setup import setup
from .train.checkpoint import CheckpointError
from .train.early_stopping import EarlyStopping
from .train.nonfinite import NonFiniteError
from .train.preemption import PREEMPTED_EXIT_CODE, Preempted
from .train.trainer import FitResult, Trainer
from . import doctor  # tt.doctor.watch(); after the core it builds on
from .tuning import tune  # tt.tune: the tuner, a function; its package is turbotrain.tuning

__version__ = "0.1.0"

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
