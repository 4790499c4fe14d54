"""What a finding asks the what-ifs to measure (:mod:`turbotrain.doctor.whatif`): one dataclass per kind.

A rule attaches one to its finding (``Finding.trial``); the what-ifs dispatch on its type and
write what they measured back into the finding (``what_if``, a :mod:`.results` dataclass; ``est_speedup``,
``severity``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from .sites import Site

__all__ = ["PlanTrial", "BatchTrial", "LoaderTrial", "CopyTrial", "EvalGradTrial", "AttentionTrial", "ThreadsTrial",
           "TrialRequest"]


@dataclass(frozen=True)
class PlanTrial:
    """Plan switches timed on a copy of the captured model, against a baseline with the script's settings."""

    changes: dict[str, Any]
    baseline: dict[str, Any] = field(default_factory=dict)  # the script's own setting where the Plan default differs
    compile: bool = False                                     # only with --compile (slow to compile)


@dataclass(frozen=True)
class BatchTrial:
    """Samples/s at a multiple of the captured batch."""


@dataclass(frozen=True)
class LoaderTrial:
    """The script's DataLoader re-timed with more workers."""


@dataclass(frozen=True)
class CopyTrial:
    """Host-to-device copies from pinned memory (GPU only: nothing is timed on a CPU yet)."""


@dataclass(frozen=True)
class EvalGradTrial:
    """The captured model's eval forward with autograd on and off; ``share`` of the step it took."""

    share: float


@dataclass(frozen=True)
class AttentionTrial:
    """A hand-written attention (lines ``first..last`` of ``file``) timed against scaled_dot_product_attention."""

    file: str
    lines: tuple[int, int]
    softmax: Site
    per_step: float
    causal: bool


@dataclass(frozen=True)
class ThreadsTrial:
    """(intra-op threads, DataLoader workers) settings timed against the script's own."""

    candidates: tuple[tuple[int, int], ...]


TrialRequest = Union[PlanTrial, BatchTrial, LoaderTrial, CopyTrial, EvalGradTrial, AttentionTrial, ThreadsTrial]
