"""Training recipes: one YAML file naming a reference workload, a Plan and the Trainer's limits.

    workload: cnn               # gpt | cnn | mlp
    plan: fast                  # 'fast', 'naive', or a mapping of Plan switches
    training_hyperparams:       # SuperGradients-style switches, mapped onto the Plan
      torch_compile: true
      torch_compile_mode: max-autotune
    trainer:                    # any Trainer limit or cadence
      max_steps: 200
      log_every_n_steps: 20

YAML is read with ``yaml.safe_load``: tags that would construct Python objects are errors,
as are unknown keys and mistyped values (each error names the key and what is allowed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from .config import ConfigError, from_mapping, strict
from .plan import CompileMode, Plan
from .train.config import TrainerConfig

__all__ = ["Recipe", "load_yaml", "load_recipe", "TrainingHyperparams"]


def load_yaml(path_or_text: str | os.PathLike) -> tuple[Any, str]:
    """Parse a YAML file (or YAML text) safely; returns (data, a name for error messages)."""
    text, where = None, "<yaml>"
    candidate = Path(path_or_text)
    if isinstance(path_or_text, os.PathLike) or ("\n" not in str(path_or_text) and candidate.suffix in (".yaml", ".yml")):
        if not candidate.is_file():
            raise ConfigError(f"{candidate}: no such file.")
        text, where = candidate.read_text(), str(candidate)
    else:
        text = str(path_or_text)
    try:
        return yaml.safe_load(text), where
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}{at}: not valid YAML for turbotrain: {problem}. "
                          "Only plain mappings, lists, strings and numbers are accepted.") from None


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
