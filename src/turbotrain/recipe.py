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
from pathlib import Path
from typing import Any, Literal

import yaml

from .config import ConfigError, from_mapping, strict
from .plan import CompileMode, Plan
from .train.config import TrainerConfig

__all__ = ["Recipe", "load_yaml", "load_recipe", "TrainingHyperparams"]


class _StrictLoader(yaml.SafeLoader):
    """``yaml.safe_load``, except that a key given twice is an error (PyYAML keeps the last one)."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *defaults` then overriding a key is how merges are meant to be used
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:
            continue  # unhashable: construct_mapping reports it
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


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
        return yaml.load(text, Loader=_StrictLoader), where  # noqa: S506 - a SafeLoader subclass
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

    def _check(self) -> None:
        if self.lr is not None and not 0 < self.lr < math.inf:  # NaN included
            raise ConfigError(f"Recipe.lr: {self.lr} is not allowed; expected a finite number > 0.")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"Recipe.batch_size: {self.batch_size} is not allowed; expected an integer >= 1.")

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
