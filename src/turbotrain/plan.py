"""The Plan: one typed, validated description of every speed switch.

``Plan()`` is the naive plan, exactly what a plain PyTorch loop does. ``Plan.fast(model)``
is the recommendation for the detected hardware, assembled from the registry's rules.
A Plan round-trips through YAML and JSON; an unknown key or a bad value is a
:class:`~turbotrain.config.ConfigError` that names it and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from .config import ConfigError, from_mapping, strict, to_mapping
from .yaml_io import load_yaml

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

__all__ = ["Plan", "Precision", "CompileMode", "Strategy", "PipelineSchedule"]

Precision = Literal["fp32", "bf16-mixed", "fp16-mixed", "bf16-true"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
Strategy = Literal["auto", "ddp", "fsdp", "pipeline"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved-1f1b"]
_PIPELINE_SETTINGS = ("pipeline_stages", "microbatches", "schedule", "stages_per_process")
# Each worker is a process and each thread a thread of its own: past these a count is a typo, not a setting.
_MOST = {"num_workers": 256, "intra_op_threads": 1024}


@strict
@dataclass(frozen=True)
class Plan:
    """Every switch turbotrain knows. Defaults reproduce a plain PyTorch training loop."""

    device: str = "auto"
    """'auto' (CUDA when present, else CPU), 'cpu', 'cuda', 'cuda:N'."""
    precision: Precision = "fp32"
    """'fp32'; 'bf16-mixed' / 'fp16-mixed' autocast (fp16 adds a GradScaler); 'bf16-true' bf16 weights."""
    compile: bool | CompileMode = False
    """torch.compile the model: False, True (mode 'default') or a mode name."""
    channels_last: bool = False
    """NHWC memory format for 4D conv nets and their inputs."""
    cudnn_benchmark: bool = False
    """Let cuDNN time its algorithms once per input shape (static shapes)."""
    tf32: bool = False
    """TF32 tensor cores for fp32 matmuls and convolutions (Ampere or newer)."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; gradients are not synchronized until the last."""
    set_to_none: bool = True
    """zero_grad(set_to_none=True): drop gradients instead of writing zeros (torch's default)."""
    fused_optimizer: bool = False
    """Switch the optimizer to its fused (or else foreach) implementation."""
    drop_conv_bias: bool = False
    """Remove conv biases that a BatchNorm cancels anyway (exact rewrite)."""
    pin_memory: bool | None = None
    """Page-locked host batches for faster, asynchronous copies. None keeps the loader's setting."""
    non_blocking: bool = False
    """Host-to-device copies that do not block the host."""
    device_prefetch: bool = False
    """Copy the next batch to the device on a side stream while the current one computes."""
    num_workers: int | None = None
    """DataLoader worker processes. None keeps the loader's setting."""
    intra_op_threads: int | None = None
    """torch's intra-op CPU threads (torch.set_num_threads). None keeps torch's (and OMP_NUM_THREADS's) setting."""
    persistent_workers: bool | None = None
    """Keep DataLoader workers alive between epochs. None keeps the loader's setting."""
    batch_size: int | None = None
    """Samples per micro-batch. None keeps the loader's setting."""
    strategy: Strategy = "auto"
    """'auto' (DDP when launched with several processes), 'ddp', 'fsdp' or 'pipeline' (x FSDP when the
    processes outnumber the pipeline's)."""
    pipeline_stages: int | None = None
    """strategy='pipeline': stages the model is split into (None: one per process, two with interleaved-1f1b)."""
    microbatches: int | None = None
    """strategy='pipeline': micro-batches each batch is split into (None: as many as stages); >= stages."""
    schedule: PipelineSchedule | None = None
    """strategy='pipeline': 'gpipe', '1f1b' or 'interleaved-1f1b' (None: '1f1b')."""
    stages_per_process: int | None = None
    """strategy='pipeline': stages each process runs (None: 1; 2 with 'interleaved-1f1b', which needs >= 2)."""
    sync_batchnorm: bool | Literal["force"] = False
    """Convert BatchNorm to SyncBatchNorm under DDP/FSDP; refused with compile unless 'force'."""

    def _check(self) -> None:
        if self.grad_accum_steps < 1:
            raise ConfigError(
                f"Plan.grad_accum_steps: {self.grad_accum_steps} is not allowed; expected an integer >= 1."
            )
        if self.num_workers is not None and self.num_workers < 0:
            raise ConfigError(f"Plan.num_workers: {self.num_workers} is not allowed; expected an integer >= 0 or null.")
        if self.intra_op_threads is not None and self.intra_op_threads < 1:
            raise ConfigError(
                f"Plan.intra_op_threads: {self.intra_op_threads} is not allowed; expected an integer >= 1 or null."
            )
        for name, most in _MOST.items():
            value = getattr(self, name)
            if value is not None and value > most:
                raise ConfigError(
                    f"Plan.{name}: {value} is not allowed; expected at most {most} (each one is a process or "
                    "thread of its own: more is a typo, not a setting)."
                )
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"Plan.batch_size: {self.batch_size} is not allowed; expected an integer >= 1 or null.")
        if self.persistent_workers and self.num_workers == 0:
            raise ConfigError("Plan.persistent_workers: true needs num_workers > 0 (there are no workers to keep).")
        self._check_pipeline()

    def _check_pipeline(self) -> None:
        given = [name for name in _PIPELINE_SETTINGS if getattr(self, name) is not None]
        if self.strategy != "pipeline":
            if given:
                raise ConfigError(
                    f"Plan.{given[0]}: a pipeline setting, and strategy is {self.strategy!r}; "
                    "set strategy='pipeline' to split the model into stages."
                )
            return
        for name in ("pipeline_stages", "microbatches", "stages_per_process"):
            value = getattr(self, name)
            if value is not None and value < (2 if name == "pipeline_stages" else 1):
                raise ConfigError(
                    f"Plan.{name}: {value} is not allowed; expected an integer >= "
                    f"{2 if name == 'pipeline_stages' else 1} or null."
                )
        if self.pipeline_stages and self.microbatches and self.microbatches < self.pipeline_stages:
            raise ConfigError(
                f"Plan.microbatches: {self.microbatches} micro-batches for "
                f"{self.pipeline_stages} stages; "
                "a pipeline needs at least one micro-batch per stage (more shrinks the bubble)."
            )
        interleaved = self.schedule == "interleaved-1f1b"
        if self.stages_per_process is not None and (self.stages_per_process > 1) != interleaved:
            raise ConfigError(
                f"Plan.stages_per_process: {self.stages_per_process} with schedule "
                f"{self.schedule or '1f1b'!r}; several stages per process need "
                "schedule='interleaved-1f1b', which needs at least 2."
            )
        if self.grad_accum_steps > 1:
            raise ConfigError(
                "Plan.grad_accum_steps: a pipeline accumulates over its micro-batches; "
                "set microbatches instead of grad_accum_steps."
            )

    # -- derived views ---------------------------------------------------------------------

    @property
    def compile_mode(self) -> str | None:
        """The torch.compile mode, or None when compile is off."""
        if self.compile is False:
            return None
        return "default" if self.compile is True else self.compile

    def replace(self, **changes: Any) -> "Plan":
        """A copy with some switches changed (validated like the constructor)."""
        allowed = {f.name for f in dataclasses.fields(self)}
        for key in changes:
            if key not in allowed:
                # Same wording as the constructor's error.
                Plan(**{key: changes[key]})
        return dataclasses.replace(self, **changes)

    def changes(self, base: "Plan | None" = None) -> dict[str, Any]:
        """The switches that differ from ``base`` (default: the naive plan)."""
        base = base or Plan()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(base, f.name)
        }

    def describe(self) -> str:
        changed = self.changes()
        return "naive (plain PyTorch)" if not changed else ", ".join(f"{k}={v}" for k, v in changed.items())

    # -- constructors -----------------------------------------------------------------------

    @classmethod
    def fast(cls, model: nn.Module | None = None, device: str = "auto") -> Plan:
        """The recommended plan for this hardware (and this model, when given), by rule.

        Each registry entry contributes its own rule (see ``turbotrain.speedups``); the tuner
        replaces rules by measurement.
        """
        from .speedups.registry import recommend_plan  # the registry imports Plan

        return recommend_plan(model=model, device=device)

    # -- (de)serialisation --------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return to_mapping(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "plan") -> "Plan":
        return from_mapping(cls, data, where)

    def to_yaml(self, path: str | os.PathLike[str] | None = None) -> str:
        """YAML text of the plan; written to ``path`` when given."""
        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_yaml(cls, path_or_text: str | os.PathLike[str]) -> Plan:
        """Load a plan from a YAML file (or YAML text). Unknown keys and bad values are errors."""

        data, where = load_yaml(path_or_text)
        if data is None:
            return cls()
        if isinstance(data, dict) and set(data) == {"plan"}:
            data = data["plan"]
        return cls.from_dict(data, where=where)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())
