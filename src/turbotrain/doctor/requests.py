"""What a finding asks the what-ifs to measure (:mod:`turbotrain.doctor.whatif`): one dataclass per kind.

A rule attaches one to its finding (``Finding.request``); the what-ifs dispatch on its type and
write what they measured back into the finding (``what_if``, a :mod:`.results` dataclass; ``est_speedup``,
``severity``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from .rank_change import RankChange
from .sites import Site

__all__ = [
    "PlanRequest",
    "BatchRequest",
    "LoaderRequest",
    "CopyRequest",
    "EvalGradRequest",
    "AttentionRequest",
    "ThreadsRequest",
    "BatchBuildRequest",
    "JobRequest",
    "OwnTrial",
    "WhatIfRequest",
]


@dataclass(frozen=True)
class PlanRequest:
    """Plan switches timed on a copy of the captured model, against a baseline with the script's settings."""

    changes: dict[str, Any]
    baseline: dict[str, Any] = field(default_factory=dict)  # the script's own setting where the Plan default differs
    compile: bool = False  # only with --compile (slow to compile)


@dataclass(frozen=True)
class BatchRequest:
    """Samples/s at ``factor`` times the captured batch (the rule chose a factor whose batch fits)."""

    factor: int


@dataclass(frozen=True)
class LoaderRequest:
    """The script's DataLoader re-timed with more workers."""


@dataclass(frozen=True)
class CopyRequest:
    """Host-to-device copies from pinned memory (GPU only: nothing is timed on a CPU yet)."""


@dataclass(frozen=True)
class EvalGradRequest:
    """The captured model's eval forward with autograd on and off; ``share`` of the step it took."""

    share: float


@dataclass(frozen=True)
class AttentionRequest:
    """A hand-written attention (lines ``first..last`` of ``file``) timed against scaled_dot_product_attention."""

    file: str
    lines: tuple[int, int]
    softmax: Site
    per_step: float
    causal: bool


@dataclass(frozen=True)
class ThreadsRequest:
    """(intra-op threads, DataLoader workers) settings timed against the script's own."""

    candidates: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class BatchBuildRequest:
    """A batch built one sample at a time at ``site`` (a list comprehension of slices, stacked) timed against the
    same batch built with one indexing op, on the data the script's module holds (``share``: of the step, measured
    at that line)."""

    site: Site
    share: float


@dataclass(frozen=True)
class OwnTrial:
    """Timed by the finding's own rule (``Rule.measure``, in the rule's module); the what-if stage attaches what it
    returns. ``first``: timed before the plan's trials, with the whole budget: the question it answers leads the
    report (whether a compiled script's compiling pays)."""

    first: bool = False


@dataclass(frozen=True)
class JobRequest:
    """A fix applied on every rank of a multi-process job (``change``: a :class:`.rank_change.RankChange`), timed by
    re-running the user's launcher with and without it, alternately (:mod:`.whatif.job`)."""

    change: RankChange


WhatIfRequest = Union[
    PlanRequest,
    BatchRequest,
    LoaderRequest,
    CopyRequest,
    EvalGradRequest,
    AttentionRequest,
    ThreadsRequest,
    BatchBuildRequest,
    JobRequest,
    OwnTrial,
]
