"""What a bench run found: a row per plan, a table per workload, the run with its machine and notes.

Plain data, written to JSON by ``bench/report.py``; ``bench/rows.py`` fills the rows in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Row", "WorkloadResult", "BenchResult"]


@dataclass
class Row:
    """One measured (or skipped) plan of one workload."""

    label: str
    kind: str
    path: str
    speedup_name: str | None
    changes: dict[str, Any]
    skip: str | None = None
    error: str | None = None
    note: str = ""
    inverse: bool = False
    baseline: str | None = None  # the row the speed-up is against
    samples_per_step: int | None = None  # per optimizer step (micro-batches x batch size)
    units_per_s: float | None = None  # median over repeats
    units_per_s_runs: list[float] = field(default_factory=list)
    step_s: float | None = None  # median over repeats of each repeat's median step
    spread: float | None = None  # relative (max - min) / median of units_per_s_runs
    speedup: float | None = None
    noise: float | None = None
    verdict: str | None = None
    warmup_cold_s: float | None = None  # warm-up beyond steady state, first repeat (compile: cold)
    warmup_warm_s: float | None = None  # the same, median of later repeats (compile: warm cache)
    peak_memory_bytes: int | None = None
    first_loss: float | None = None
    final_loss: float | None = None
    learning: bool | None = None  # the loss fell over the trial and stayed finite
    mfu: float | None = None
    read_bytes: dict[str, int] = field(default_factory=dict)  # data workload: bytes per URL scheme (first repeat)
    applied: list[str] = field(default_factory=list)
    plan_skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return self.skip is None and self.error is None and self.units_per_s is not None


@dataclass
class WorkloadResult:
    name: str
    unit: str
    scale: str
    batch_size: int
    params: int
    flops_per_token: float | None
    rows: list[Row]
    steps: int = 0  # measured steps per trial (after calibration; data: per epoch)
    description: str = ""  # what the workload's data is, when the title does not say
    skip: str | None = None  # why the workload could not run at all; its rows are skips


@dataclass
class BenchResult:
    machine: dict[str, Any]
    settings: dict[str, Any]
    notes: list[str]
    workloads: list[WorkloadResult]

    def to_dict(self) -> dict[str, Any]:
        return {"turbotrain_bench": 1, **asdict(self)}

    @property
    def errors(self) -> list[str]:
        return [f"{w.name}/{r.label}: {r.error}" for w in self.workloads for r in w.rows if r.error]
