"""Training recipes: one YAML file naming a reference workload, a Plan and the Trainer's limits.

    workload: cnn               # gpt | cnn | mlp
    plan: fast                  # 'fast', 'naive', or a mapping of Plan switches
    training_hyperparams:       # SuperGradients-style switches, mapped onto the Plan
      torch_compile: true
      torch_compile_mode: max-autotune
    trainer:                    # any Trainer limit or cadence
      max_steps: 200
      log_every_n_steps: 20

YAML is read with ``yaml.safe_load`` (and a key given twice is an error): tags that would
construct Python objects are errors, as are unknown keys and mistyped values (each error
names the key and what is allowed).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Literal


from .config import ConfigError, from_mapping, strict
from .yaml_io import load_yaml
from .plan import CompileMode, Plan
from .train.config import TrainerConfig

__all__ = ["Recipe", "load_yaml", "load_recipe", "TrainingHyperparams"]

_MAX_SEED = 2**64 - 1  # the largest seed torch's generators take


@strict
@dataclass(frozen=True)
class TrainingHyperparams:
    """SuperGradients' spelling of the compile switch (``torch_compile``, ``torch_compile_mode``)."""

    torch_compile: bool = False
    torch_compile_mode: CompileMode = "default"


@strict
@dataclass(frozen=True)
class Recipe:
    workload: Literal["gpt", "cnn", "mlp"] = "cnn"
    scale: Literal["cpu", "gpu"] = "cpu"
    seed: int = 0
    plan: Plan | Literal["fast", "naive"] = "naive"
    training_hyperparams: TrainingHyperparams = field(default_factory=TrainingHyperparams)
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(max_steps=100))
    batch_size: int | None = None
    lr: float | None = None
    resume: bool = False

    def _check(self) -> None:
        if self.lr is not None and not 0 < self.lr < math.inf:  # NaN included
            raise ConfigError(f"Recipe.lr: {self.lr} is not allowed; expected a finite number > 0.")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"Recipe.batch_size: {self.batch_size} is not allowed; expected an integer >= 1.")
        if not 0 <= self.seed <= _MAX_SEED:
            raise ConfigError(f"Recipe.seed: {self.seed} is not allowed; expected an integer from 0 to {_MAX_SEED}.")

    def resolved_plan(self, model=None) -> Plan:
        """The plan to train with: named or explicit, plus the SuperGradients compile switch."""
        if self.plan == "fast":
            plan = Plan.fast(model)
        elif self.plan == "naive":
            plan = Plan()
        else:
            plan = self.plan
        hp = self.training_hyperparams
        if hp.torch_compile:
            plan = plan.replace(compile=hp.torch_compile_mode)
        return plan


def load_recipe(path_or_text: str | os.PathLike) -> Recipe:
    data, where = load_yaml(path_or_text)
    if data is None:
        raise ConfigError(f"{where}: the recipe is empty; it needs at least 'workload:'.")
    return from_mapping(Recipe, data, where)
