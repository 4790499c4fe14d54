"""The doctor's report: what was measured, the bottleneck, the findings; as a dict for JSON.

The JSON keys the stable surface fixes (docs/doctor.md, Reports) (``device``, ``steps_measured``,
``step_time_ms``, ``breakdown``, ``bottleneck``, ``findings`` with ``rule``/``severity``/``where``/
``message``/``fix``/``est_speedup``/``measured``) are always present; the rest adds detail.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

from ..analysis.breakdown import Breakdown
from ..analysis.machine import MachineFacts, NoiseWarning
from ..analysis.periodic import PeriodicRow
from ..analysis.ranks import RankAnalysis
from ..findings import Finding, Framework
from .fix_results import FixReport
from .memory import MemorySection
from .tables import CopyRow, SyncRow
from ..record.compile_watch import CompileFacts
from ..record.measurements import CATEGORIES, Category
from ..record.profiling import TopOp
from ..record.runner import ScriptRun

__all__ = ["Report", "ReportStatus", "Failure", "exact_shares", "compiled_json"]

# ok; incomplete: fewer steps than asked; error: the script failed; no-steps: nothing stepped; partial: a part of
# the doctor failed (the report's failures say which).
ReportStatus = Literal["ok", "incomplete", "error", "no-steps", "partial"]


@dataclass(frozen=True)
class Failure:
    """A part of the doctor that failed (a rule, the trace, the patch, a report, --verify) and why."""

    part: str  # "trace", "fix", "verify", "json", "html" or "rule <id>"
    message: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def compiled_json(facts: CompileFacts, base: str | None) -> dict[str, Any]:
    """The report's "compiled" section: totals, and per compiled code its graphs, breaks, recompiles and seconds."""

    def where(site: Any) -> str | None:
        return site.where(base) if site is not None else None

    return {
        "graphs": facts.graphs,
        "breaks": facts.breaks,
        "recompiles": facts.recompiles,
        "compile_s": round(facts.compile_s, 3),
        "fell_back": facts.fell_back,
        "in_graphs_ms_per_step": None
        if facts.in_graphs is None
        else {
            "forward": round(facts.in_graphs.forward_ms, 3),
            "backward": round(facts.in_graphs.backward_ms, 3),
            "outside": round(facts.in_graphs.outside_ms, 3),
            "step": round(facts.in_graphs.step_ms, 3),
        },
        "codes": [
            {
                "name": c.name,
                "where": where(c.site),
                "compiles": c.compiles,
                "graphs": c.graphs,
                "first_compile_s": round(c.first_compile_s, 3),
                "recompile_s": round(c.recompile_s, 3),
                "cache_hits": c.cache_hits,
                "cache_misses": c.cache_misses,
                "breaks": [
                    {"where": where(b.site), "title": b.title, "gb_id": b.gb_id, "count": b.count, "eager": b.skipped}
                    # where torch broke in a library's code the line ran: left out at the user's own line
                    | ({"inside": f"{b.inside.file}:{b.inside.line}"} if b.inside is not None else {})
                    for b in c.breaks
                ],
                "recompiles": [
                    {
                        "kind": r.kind,
                        "guard": r.guard,
                        "where": where(r.caller or r.site),
                        "seconds": round(r.seconds, 3),
                    }
                    for r in c.recompiles
                ],
                "fell_back": c.fallback is not None,
            }
            for c in facts.codes
        ],
    }


def exact_shares(shares: dict[Category, float], digits: int = 4) -> dict[Category, float]:
    """Rounded shares that still sum to exactly 1 (the rounding error goes to the largest)."""
    rounded = {k: round(shares.get(k, 0.0), digits) for k in CATEGORIES}
    total = sum(rounded.values())
    if total > 0:
        biggest = max(rounded, key=lambda k: rounded[k])
        rounded[biggest] = round(rounded[biggest] + (1.0 - total), digits + 2)
    return rounded


@dataclass
class Report:
    status: ReportStatus
    breakdown: Breakdown | None
    findings: list[Finding]
    device: str = "cpu"
    hardware: str = ""
    script: str | None = None
    argv: list[str] = field(default_factory=list)
    run: ScriptRun | None = None
    steps_requested: int = 0
    warmup_steps: int = 0
    steps_completed: int = 0
    messages: list[str] = field(default_factory=list)
    syncs: list[SyncRow] = field(default_factory=list)
    copies: list[CopyRow] = field(default_factory=list)
    top_ops: list[TopOp] = field(default_factory=list)
    trace_path: str | None = None
    doctor_seconds: dict[str, float] = field(default_factory=dict)
    base: str | None = None
    # How steps were delimited: "optimizer.step()", "loss.backward()" (no optimizer stepped) or "watch.step()".
    step_delimiter: str = "optimizer.step()"
    # The machine as the run saw it: usable cores (affinity, cgroup quota), torch's threads, DataLoader
    # workers, other processes' load during the window, and the step-time dispersion (p90/p10).
    # None: not known (no steps, a job that failed); JSON {}.
    machine: MachineFacts | None = None
    # Set when the window's dispersion or the machine's outside load is too high to trust small gains.
    noise: NoiseWarning | None = None
    # Work that recurs every N steps (validation, checkpoints, logging), amortised over its period.
    periodic: list[PeriodicRow] = field(default_factory=list)
    # doctor --fix [--verify]: each fixable finding's diff, predicted and verified speed-up, the patch written.
    fixes: FixReport | None = None
    # A multi-process job: every rank side by side, the straggler, the exposed communication (report/ranks.py).
    ranks: RankAnalysis | None = None
    # The parts of the doctor that failed (a rule that crashed, a trace, patch or report not written, a --verify
    # that could not run). Each is also a message; the exit code is 1.
    failures: list[Failure] = field(default_factory=list)
    # What torch.compile did, where the script compiled (record/compile_watch.py): JSON "compiled".
    compiled: CompileFacts | None = None
    # The step's peak memory split into what holds it, and the device's headroom (report/memory.py); None: not
    # looked at (a job, no steps).
    memory: MemorySection | None = None
    # The framework whose loop stepped the optimizer, as the recording saw it (record/drivers.py).
    driver: Framework | None = None

    def fail(self, part: str, message: str) -> None:
        """Say that ``part`` failed, in every report, and make the exit code non-zero: a report never claims what
        did not happen."""
        self.failures.append(Failure(part, message))
        self.messages.append(message)
        if self.status == "ok":
            self.status = "partial"

    @property
    def exit_code(self) -> int:
        if self.status == "error":
            return self.run.exit_code or 1 if self.run else 1
        return 1 if self.status == "no-steps" or self.failures else 0

    @property
    def bottleneck(self) -> str | None:
        return self.breakdown.bottleneck if self.breakdown and self.breakdown.steps else None

    def rules(self) -> set[str]:
        return {f.rule for f in self.findings}

    @property
    def framework(self) -> Framework | None:
        """The framework whose loop ran (``pytorch``, ``lightning``, ``fabric``, ``accelerate``, ``hf_trainer``), as
        the recording saw it step the optimizer, with findings or without; None where nothing stepped."""
        if self.driver is not None:
            return self.driver
        return next((f.fix.framework for f in self.findings if f.fix.framework != "pytorch"), None) or (
            "pytorch" if self.findings else None
        )

    def to_dict(self) -> dict[str, Any]:
        b = self.breakdown
        out: dict[str, Any] = {
            "version": 1,
            "script": self.script,
            "argv": self.argv,
            "status": self.status,
            "exit_code": self.exit_code,
            "device": self.device,
            "hardware": self.hardware,
            "torch": torch.__version__,
            "steps_requested": self.steps_requested,
            "warmup_steps": self.warmup_steps,
            "steps_completed": self.steps_completed,
            "steps_measured": len(b.steps) if b else 0,
        }
        if b and b.steps:
            out["step_time_ms"] = {
                "median": round(b.median_s * 1e3, 3),
                "p90": round(b.quantile_s(0.9) * 1e3, 3),
                "p10": round(b.quantile_s(0.1) * 1e3, 3),
                "mean": round(b.mean_s * 1e3, 3),
            }
            out["breakdown"] = exact_shares(b.shares)
            out["breakdown_ms"] = {k: round(v * 1e3, 4) for k, v in b.seconds.items()}
            # breakdown_ms + interference_ms == step_time_ms.mean: time other processes took is not the script's.
            out["interference_ms"] = round(b.interference_s * 1e3, 4)
            out["bottleneck"] = b.bottleneck
            out["python_overhead"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in b.overhead.items()}
            # Dispatch/interpreter overhead inside each phase (share of that phase), and of the whole step.
            out["dispatch"] = {
                **{k: round(b.dispatch_of(k), 4) for k in b.dispatch},
                "step_share": round(b.dispatch_share, 4),
            }
            out["warmup_included"] = b.warmup_included
            out["settling_ms"] = [round(t * 1e3, 3) for t in b.settling]  # slow steps left out after the warm-up
            out["timeline"] = b.timeline
        else:
            out["step_time_ms"] = {"median": None, "p90": None}
            out["breakdown"] = dict.fromkeys(CATEGORIES, 0.0)
            out["bottleneck"] = None
        out["step_delimiter"] = self.step_delimiter
        out["machine"] = self.machine.to_dict() if self.machine is not None else {}
        out["noise"] = self.noise.to_dict() if self.noise is not None else None
        out["periodic"] = [r.to_dict() for r in self.periodic]
        out["framework"] = self.framework
        out["findings"] = [f.to_dict(self.base) for f in self.findings]
        out["syncs"] = [r.to_dict() for r in self.syncs]
        out["copies"] = [r.to_dict() for r in self.copies]
        out["top_ops"] = [r.to_dict() for r in self.top_ops]
        out["messages"] = self.messages
        out["failures"] = [f.to_dict() for f in self.failures]
        if self.memory is not None:
            out["memory"] = self.memory.to_dict()
        if self.fixes is not None:
            out["fixes"] = [f.to_dict() for f in self.fixes.fixes]
            out["patch"] = self.fixes.summary()
        if self.run is not None and self.run.failed:
            out["error"] = {
                "message": self.run.error,
                "where": self.run.error_site.where(self.base) if self.run.error_site else None,
                "traceback": self.run.traceback,
            }
        if self.ranks is not None:
            from .ranks import ranks_json

            out.update(ranks_json(self.ranks, self.base))
        if self.compiled is not None:
            out["compiled"] = compiled_json(self.compiled, self.base)
        if self.trace_path:
            out["trace"] = self.trace_path
        out["doctor_seconds"] = {k: round(v, 2) for k, v in self.doctor_seconds.items()}
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def write_json(self, path: str | os.PathLike) -> None:
        from .files import write_text

        write_text(path, self.to_json())
