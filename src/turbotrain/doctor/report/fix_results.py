"""What came of ``doctor --fix``: each fix's edit or why it was left to the user, and its verification.

Plain data the report holds and shows; :mod:`turbotrain.doctor.fixes` fills it in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal, Union

__all__ = ["EditRequest", "FixResult", "FixReport", "Verification", "EXACT", "PRECISION", "REINITIALISED"]

from ...measure import Verdict
from ..edits import EXACT, PRECISION, REINITIALISED, EditRequest, Numerics, Purpose


FITS: Final = "fits"  # the original ran out of memory and the patched script ran: no ratio to judge
VerifyVerdict = Union[Verdict, Literal["fits"]]


@dataclass
class Verification:
    """Original against patched, interleaved in rounds on the same steps."""

    speedup: float | None = None  # the judged median/geometric-mean ratio, original time / patched time
    verdict: VerifyVerdict = "unverified"  # measure.judge's, or FITS
    ratios: list[float] = field(default_factory=list)
    original_ms: list[float] = field(default_factory=list)  # mean ms per step of each original run
    patched_ms: list[float] = field(default_factory=list)
    steps: int = 0
    loss_match: dict[str, Any] | None = None
    error: str | None = None  # the patched (or original) script failed: why
    # Autograd graphs kept from step to step on each side, where either kept some (fixes/verify.py graphs_kept).
    graphs_kept: dict[str, Any] | None = None
    # Each side's memory peak over its measured steps (fixes/verify.py peak_memory).
    peak_memory: dict[str, Any] | None = None
    # The original ran out of memory (its error), so only the patched script was run: a fix that makes it fit.
    original_out_of_memory: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "speedup": _round(self.speedup),
            "verdict": self.verdict,
            "ratios": [round(r, 3) for r in self.ratios],
            "original_ms_per_step": [round(v, 3) for v in self.original_ms],
            "patched_ms_per_step": [round(v, 3) for v in self.patched_ms],
            "steps": self.steps,
        }
        if self.graphs_kept:
            out["graphs_kept"] = self.graphs_kept
        if self.peak_memory:
            out["peak_memory"] = self.peak_memory
        if self.error:
            out["error"] = self.error
        if self.original_out_of_memory:
            out["original_out_of_memory"] = self.original_out_of_memory
        return out


def _round(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


@dataclass
class FixResult:
    """What came of one finding's fix: its diff, or why it is by hand or left out, and what verifying it gave."""

    rule: str
    where: str
    label: str
    numerics: Numerics = EXACT
    predicted: float | None = None
    diff: str | None = None  # this fix alone against the original
    by_hand: str | None = None  # not an edit: why, and the line to change
    dropped: str | None = None  # an edit left out of the final patch: why
    verification: Verification | None = None
    # Why the what-if speaks against it ("the what-if measured it slower (x0.62)"): then only verifying it alone,
    # faster, keeps it in the patch.
    doubt: str | None = None
    purpose: Purpose = "time"  # a memory fix is kept when it lowers the peak, even at a cost in time
    request: EditRequest | None = field(default=None, repr=False)

    @property
    def edit(self) -> bool:
        return self.diff is not None

    @property
    def in_patch(self) -> bool:
        return self.edit and self.dropped is None

    @property
    def verified(self) -> float | None:
        return self.verification.speedup if self.verification else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rule": self.rule,
            "where": self.where,
            "label": self.label,
            "diff": self.diff,
            "predicted": _round(self.predicted),
            "verified": _round(self.verified),
            "loss_match": self.verification.loss_match if self.verification else None,
            "numerics": self.numerics,
            "purpose": self.purpose,
            "in_patch": self.in_patch,
        }
        if self.by_hand:
            out["by_hand"] = self.by_hand
        if self.dropped:
            out["dropped"] = self.dropped
        if self.verification:
            out["verification"] = self.verification.to_dict()
        return out


@dataclass
class FixReport:
    """Every fixable finding's outcome, the patch that was written, and the fixes verified together."""

    fixes: list[FixResult] = field(default_factory=list)
    patch: str = ""  # the final patch: header and the diff of every fix kept
    path: str | None = None  # where it was written (None: not asked to write, or refused)
    together: Verification | None = None
    predicted_together: float | None = None
    messages: list[str] = field(default_factory=list)

    @property
    def kept(self) -> list[FixResult]:
        return [f for f in self.fixes if f.in_patch]

    def summary(self) -> dict[str, Any]:
        together = self.together
        return {
            "path": self.path,
            "edits": len(self.kept),
            "by_hand": sum(1 for f in self.fixes if f.by_hand),
            "dropped": sum(1 for f in self.fixes if f.dropped),
            "predicted": _round(self.predicted_together),
            "verified": _round(together.speedup) if together else None,
            "loss_match": together.loss_match if together else None,
            "verification": together.to_dict() if together else None,
            "messages": self.messages,
        }
