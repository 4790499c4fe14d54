"""What a what-if measured (:mod:`turbotrain.doctor.whatif`): one frozen dataclass per kind, the answer to a
request of :mod:`.requests`.

The what-ifs write one into the finding (``Finding.what_if``); the report, the fixes and the tests read its
attributes, and :meth:`WhatIf.to_dict` is its JSON in the report (a stable surface: the keys, their order and
their rounding are what the report has always carried). The values are held as the report shows them
(rounded), so an attribute reads what the JSON says.

* :class:`PlanResult` (``plan``): a :class:`~.requests.PlanRequest`, compile and the fresh-process re-timing
  included;
* :class:`BatchResult` (``batch``): a :class:`~.requests.BatchRequest`;
* :class:`LoaderResult` (``num_workers``): a :class:`~.requests.LoaderRequest`;
* :class:`ThreadsResult` (``threads``): a :class:`~.requests.ThreadsRequest`;
* :class:`EvalGradResult` (``eval_grad``): an :class:`~.requests.EvalGradRequest`;
* :class:`AttentionResult` (``attention``): an :class:`~.requests.AttentionRequest`;
* :class:`BatchBuildResult` (``batch_build``): a :class:`~.requests.BatchBuildRequest`;
* :class:`JobResult` (``job``): a :class:`~.requests.JobRequest`, timed on every rank of a job;
* :class:`MemoryResult` (``memory``): an :class:`~.requests.OwnTrial` of a memory rule, bytes and time.
* :class:`CompileResult` (``compile``): an :class:`~.requests.OwnTrial` of a compile rule, the script's compiled
  model run two ways.

A :class:`~.requests.CopyRequest` has no result yet: nothing is timed for it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, Union

if TYPE_CHECKING:  # pragma: no cover
    from ..measure import Comparison, Verdict

__all__ = [
    "WhatIf",
    "Judgement",
    "PairTimed",
    "ThreadSetting",
    "PlanResult",
    "BatchResult",
    "LoaderResult",
    "ThreadsResult",
    "EvalGradResult",
    "AttentionResult",
    "BatchBuildResult",
    "JobResult",
    "MeasuredFix",
    "MemoryResult",
    "CompileResult",
    "WhatIfResult",
]

W = TypeVar("W", bound="WhatIf")


def _present(**values: Any) -> dict[str, Any]:
    """The optional fields that have a value, in the order given (tuples as the lists JSON gives back)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class Judgement:
    """:func:`turbotrain.measure.judge`'s verdict on a what-if's interleaved rounds."""

    ratio: float  # the judged speed ratio (> 1: the fix is faster), rounded to 3 places
    noise: float  # the margin it had to clear, rounded to 3 places
    verdict: Verdict

    @classmethod
    def of(cls, comparison: Comparison) -> Judgement:
        return cls(ratio=round(comparison.speedup, 3), noise=round(comparison.noise, 3), verdict=comparison.verdict)

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "noise": self.noise, "verdict": self.verdict}


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    """What one what-if measured: a subclass per kind. ``judgement`` is set where the gain was judged from
    interleaved rounds (:func:`turbotrain.doctor.whatif.outcome.attach`)."""

    kind: ClassVar[str]
    judgement: Judgement | None = None

    @property
    def verdict(self) -> str | None:
        return self.judgement.verdict if self.judgement is not None else None

    @property
    def ratio(self) -> float | None:
        return self.judgement.ratio if self.judgement is not None else None

    @property
    def noise(self) -> float | None:
        return self.judgement.noise if self.judgement is not None else None

    def judged(self: W, comparison: Comparison) -> W:
        """This result with ``comparison`` as its judgement."""
        return dataclasses.replace(self, judgement=Judgement.of(comparison))

    def to_dict(self) -> dict[str, Any]:
        """The report's JSON of this result, ``kind`` first."""
        return {"kind": self.kind, **self._fields(), **(self.judgement.to_dict() if self.judgement else {})}

    def _fields(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class PairTimed(WhatIf):
    """A what-if whose gain rests on one timed comparison (slow / fast), held to the window's noise floor as
    ``pair_rounds`` interleaved rounds (:func:`turbotrain.doctor.whatif.outcome.cap_to_noise`)."""

    pair_ratio: float
    pair_rounds: int

    def _pair(self) -> dict[str, Any]:
        return {"pair_ratio": self.pair_ratio, "pair_rounds": self.pair_rounds}


@dataclass(frozen=True)
class ThreadSetting:
    """Intra-op threads and DataLoader workers."""

    threads: int
    workers: int

    def to_dict(self) -> dict[str, Any]:
        return {"threads": self.threads, "workers": self.workers}


@dataclass(frozen=True, kw_only=True)
class PlanResult(WhatIf):
    """Plan switches timed on a copy of the captured model against the script's own settings; the fresh-process
    fields are set where the switch was re-timed in processes of its own (:mod:`.whatif.fresh`), ``compile_s``
    where the switch compiles."""

    kind: ClassVar[str] = "plan"
    changes: dict[str, Any]
    steps: int
    losses_finite: bool
    rounds: tuple[float, ...] = ()  # per-round ratios, the ones judged
    page_faults_per_step: int | None = None  # set where the steps page-faulted enough to re-time
    timed_in: str | None = None  # "fresh processes" or "this process" (the re-timing failed)
    in_process_rounds: tuple[float, ...] | None = None  # the doctor's own process's rounds, once re-timed
    candidate_ms: float | None = None
    compile_s: float | None = None

    def _fields(self) -> dict[str, Any]:
        return {
            "changes": dict(self.changes),
            "steps": self.steps,
            "losses_finite": self.losses_finite,
            **_present(
                page_faults_per_step=self.page_faults_per_step,
                timed_in=self.timed_in,
                in_process_rounds=self.in_process_rounds,
            ),
            "rounds": list(self.rounds),
            **_present(candidate_ms=self.candidate_ms, compile_s=self.compile_s),
        }


@dataclass(frozen=True, kw_only=True)
class BatchResult(WhatIf):
    """Samples/s at ``candidate_batch_size`` against ``batch_size``: the model's own rounds, and the whole step's
    with the loader's ratio at the larger batch."""

    kind: ClassVar[str] = "batch"
    batch_size: int
    candidate_batch_size: int
    rounds: tuple[float, ...]
    model_rounds: tuple[float, ...]
    loader_samples_ratio: float
    loader: str  # how the loader's ratio was found
    baseline_samples_per_s: float
    candidate_samples_per_s: float

    def _fields(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "candidate_batch_size": self.candidate_batch_size,
            "rounds": list(self.rounds),
            "model_rounds": list(self.model_rounds),
            "loader_samples_ratio": self.loader_samples_ratio,
            "loader": self.loader,
            "baseline_samples_per_s": self.baseline_samples_per_s,
            "candidate_samples_per_s": self.candidate_samples_per_s,
        }


@dataclass(frozen=True, kw_only=True)
class LoaderResult(PairTimed):
    """The DataLoader's batches/s per ``num_workers`` and the step projected at the best; the ``rounds`` and
    timings of the model training beside the loader where that was verified (then judged from them)."""

    kind: ClassVar[str] = "num_workers"
    batches_per_s: dict[int, float]
    best_num_workers: int
    projected_step_ms: float
    current_projected_step_ms: float
    step_ms: float
    rounds: tuple[float, ...] | None = None
    baseline_ms: float | None = None
    candidate_ms: float | None = None

    def _fields(self) -> dict[str, Any]:
        return {
            "batches_per_s": {str(k): v for k, v in self.batches_per_s.items()},
            "best_num_workers": self.best_num_workers,
            "projected_step_ms": self.projected_step_ms,
            "current_projected_step_ms": self.current_projected_step_ms,
            "step_ms": self.step_ms,
            **self._pair(),
            **_present(rounds=self.rounds, baseline_ms=self.baseline_ms, candidate_ms=self.candidate_ms),
        }


@dataclass(frozen=True, kw_only=True)
class ThreadsResult(WhatIf):
    """The script's threads and workers (``now``) against the best of ``tried`` (``candidate``)."""

    kind: ClassVar[str] = "threads"
    now: ThreadSetting
    tried: tuple[tuple[int, int], ...]
    candidate: ThreadSetting
    rounds: tuple[float, ...]
    baseline_ms: float
    candidate_ms: float

    def _fields(self) -> dict[str, Any]:
        return {
            "now": self.now.to_dict(),
            "tried": list(self.tried),
            "candidate": self.candidate.to_dict(),
            "rounds": list(self.rounds),
            "baseline_ms": self.baseline_ms,
            "candidate_ms": self.candidate_ms,
        }


@dataclass(frozen=True, kw_only=True)
class EvalGradResult(PairTimed):
    """The captured model's eval forward with autograd on and under inference_mode."""

    kind: ClassVar[str] = "eval_grad"
    forward_ms_with_grad: float
    forward_ms_inference_mode: float

    def _fields(self) -> dict[str, Any]:
        return {
            "forward_ms_with_grad": self.forward_ms_with_grad,
            "forward_ms_inference_mode": self.forward_ms_inference_mode,
            **self._pair(),
        }


@dataclass(frozen=True, kw_only=True)
class AttentionResult(PairTimed):
    """A hand-written attention against scaled_dot_product_attention, forward and backward at its shapes."""

    kind: ClassVar[str] = "attention"
    q_shape: tuple[int, ...]
    keys: int
    causal: bool
    manual_ms: float
    sdpa_ms: float
    calls_per_step: float

    def _fields(self) -> dict[str, Any]:
        return {
            "q_shape": list(self.q_shape),
            "keys": self.keys,
            "causal": self.causal,
            "manual_ms": self.manual_ms,
            "sdpa_ms": self.sdpa_ms,
            "calls_per_step": self.calls_per_step,
            **self._pair(),
        }


@dataclass(frozen=True, kw_only=True)
class BatchBuildResult(PairTimed):
    """A batch built one sample at a time against one indexing op, on the script's own data (``rows`` samples
    of ``sample_shape``), and whether both built the same tensor."""

    kind: ClassVar[str] = "batch_build"
    per_sample_ms: float
    one_op_ms: float
    rows: int
    sample_shape: tuple[int, ...]
    data: str  # the name of the script's tensor the batch was built from
    same_batch: bool  # the one-op batch equals the per-sample one

    def _fields(self) -> dict[str, Any]:
        return {
            "per_sample_ms": self.per_sample_ms,
            "one_op_ms": self.one_op_ms,
            "rows": self.rows,
            "sample_shape": list(self.sample_shape),
            "data": self.data,
            "same_batch": self.same_batch,
            **self._pair(),
        }


@dataclass(frozen=True, kw_only=True)
class JobResult(WhatIf):
    """A fix applied on every rank of a job, timed as whole runs of the user's launcher, alternately with and
    without it: the job's step time (its slowest rank's median) each way, and what the fixed ranks trained with."""

    kind: ClassVar[str] = "job"
    change: str  # the fix, in words (RankChange.describe)
    ranks: int
    rounds: tuple[float, ...]  # per round: step time without / with the fix
    baseline_ms: float
    candidate_ms: float
    observed: dict[str, Any]  # what the fixed run's ranks trained with (apply.change.observed)

    def _fields(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "ranks": self.ranks,
            "rounds": list(self.rounds),
            "baseline_ms": self.baseline_ms,
            "candidate_ms": self.candidate_ms,
            "observed": self.observed,
        }


@dataclass(frozen=True)
class MeasuredFix:
    """A fix that trades memory for time (:mod:`.analysis.memory_fixes`), measured against its own baseline, measured
    beside it: the step's peak bytes and its time each way."""

    fix: str  # "checkpointing", "bf16-autocast", "micro-batches" or "set-to-none"
    detail: str  # what was changed: the blocks, the dtype, "4 x 16"
    baseline_bytes: int
    fixed_bytes: int
    baseline_ms: float
    fixed_ms: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class MemoryResult(WhatIf):
    """Fixes that trade memory for time, each measured against its own baseline for a step's peak bytes and its
    time (``fixes``, one :class:`MeasuredFix` per fix), and ``rows`` the batch they were measured at."""

    kind: ClassVar[str] = "memory"
    rows: int | None
    fixes: tuple[MeasuredFix, ...]

    def _fields(self) -> dict[str, Any]:
        return {"rows": self.rows, "fixes": [f.to_dict() for f in self.fixes]}


@dataclass(frozen=True, kw_only=True)
class CompileResult(WhatIf):
    """The script's compiled model run two ways on its captured batch, interleaved (``rounds``: baseline seconds
    / candidate seconds): as the script compiles it against a fix (``capture_scalar_outputs``), or compiled
    against eager; ``compile_s``: what compiling cost in the run (torch's own count), ``pays_after_steps``: the
    steps a faster compiled step takes to win it back."""

    kind: ClassVar[str] = "compile"
    baseline: str  # what was timed as the baseline, in words ("compiled as the script compiles it")
    candidate: str  # and the candidate ("compiled with capture_scalar_outputs=True")
    rounds: tuple[float, ...]
    baseline_ms: float
    candidate_ms: float
    compile_s: float | None = None
    pays_after_steps: int | None = None
    # Each side's first two calls in the trial, seconds: its compile (fresh) and one step.
    baseline_first_calls_s: float | None = None
    candidate_first_calls_s: float | None = None
    # The candidate stepped once on each of these other input lengths after its warm-up, compiling these graphs.
    other_lengths: int | None = None
    graphs_for_other_lengths: int | None = None
    # A fresh compile reading Inductor's on-disk cache (the run filled it): what a rerun on this machine pays.
    cached_compile_s: float | None = None
    # Set where the run ended by itself after this many steps: the judged ratio is over the whole run, compiling
    # included (compiled run / eager run), not over one step.
    run_steps: int | None = None

    def _fields(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "rounds": list(self.rounds),
            "baseline_ms": self.baseline_ms,
            "candidate_ms": self.candidate_ms,
            **_present(
                compile_s=self.compile_s,
                pays_after_steps=self.pays_after_steps,
                baseline_first_calls_s=self.baseline_first_calls_s,
                candidate_first_calls_s=self.candidate_first_calls_s,
                other_lengths=self.other_lengths,
                graphs_for_other_lengths=self.graphs_for_other_lengths,
                cached_compile_s=self.cached_compile_s,
                run_steps=self.run_steps,
            ),
        }


# Every kind, for code that matches on them all.
WhatIfResult = Union[
    PlanResult,
    BatchResult,
    LoaderResult,
    ThreadsResult,
    EvalGradResult,
    AttentionResult,
    BatchBuildResult,
    JobResult,
    MemoryResult,
    CompileResult,
]
