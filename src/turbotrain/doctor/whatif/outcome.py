"""What a what-if found, as a value, and the one step that attaches it to its finding.

Every trial (a Plan switch, the threads, the loader, a rule's own measurer, a fix timed on every rank) returns an
:class:`Outcome` and leaves the finding alone; :func:`attach` is the only place the what-if stage changes one: the
measured gain, severity and ``est_speedup``, the fix said again with what was measured, the notes, the evidence.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ...measure import MIN_GAIN, Comparison, judge
from ..findings import Evidence, Finding, Fix, severity_for
from ..results import PairTimed, WhatIf

if TYPE_CHECKING:
    from ..analysis.context import Context

__all__ = ["Note", "Judged", "Projected", "Outcome", "attach", "cap_to_noise", "model_share"]


@dataclass(frozen=True)
class Note:
    """A line for the finding's note: in place of it, before it or after it."""

    text: str
    at: Literal["replace", "before", "after"] = "replace"

    def on(self, note: str | None) -> str | None:
        if self.at == "replace" or not note:
            return self.text
        return f"{self.text} {note}".strip() if self.at == "before" else f"{note} {self.text}"


def not_measured(why: str, at: Literal["replace", "before", "after"] = "before") -> Note:
    return Note(f"Not measured: {why}.", at)


@dataclass(frozen=True)
class Judged:
    """A ratio of ``unit`` judged over interleaved rounds (:func:`turbotrain.measure.judge`), applying to
    ``applies_to`` of the step (None: the model's share of it)."""

    what_if: WhatIf
    verdict: Comparison
    applies_to: float | None = None
    unit: str = "model's step time"


@dataclass(frozen=True)
class Projected:
    """A share of the step worked out from one timed comparison of a part of it (held to the window's noise by
    :func:`cap_to_noise`)."""

    what_if: WhatIf
    share: float


@dataclass(frozen=True)
class Outcome:
    """What one trial found for one finding: notes ``before`` the gain is set, the gain, notes ``after`` it; the
    fix said again with what was measured (its framework kept), the rule's evidence with what was measured, and
    ``low``: rated low whatever the estimate or the measured gain (the fix failed when timed, or was timed only where
    the figure is known to read high)."""

    gain: Judged | Projected | None = None
    before: tuple[Note, ...] = ()
    after: tuple[Note, ...] = ()
    fix: Fix | None = None
    evidence: Evidence | None = None
    low: bool = False


def model_share(ctx: Context) -> float:
    return ctx.share("compute") + ctx.share("optimizer") + ctx.share("python_overhead")


def attach(finding: Finding, ctx: Context | None, outcome: Outcome | None) -> None:
    """Attach ``outcome`` to ``finding``: the one place the what-if stage changes a finding."""
    if outcome is None:
        return
    for note in outcome.before:
        finding.note = note.on(finding.note)
    if outcome.fix is not None:
        finding.fix = dataclasses.replace(outcome.fix, framework=finding.fix.framework)
    if outcome.evidence is not None:
        finding.evidence = outcome.evidence
    gain = outcome.gain
    if isinstance(gain, Judged):
        _judged(finding, ctx, gain)
    elif isinstance(gain, Projected):
        finding.what_if = gain.what_if
        finding.set_gain(gain.share, measured=True)
    if outcome.low:  # after the gain: a measured ratio is kept, its rating is not
        finding.severity = "low"
    for note in outcome.after:
        finding.note = note.on(finding.note)


def _judged(finding: Finding, ctx: Context | None, gain: Judged) -> None:
    """Turn a judged speed ratio into the finding's share of the whole step.

    A ratio the noise model cannot separate from 1.0 (the rounds' own spread, or this window's noise
    floor: another process busy, steps spread wide) counts as no gain and rates ``low``, whatever it
    reads; a switch that changes numerics must buy at least 10% to rate above ``low``.
    """
    verdict, ratio = gain.verdict, gain.verdict.speedup
    if gain.applies_to is not None:
        part = gain.applies_to
    elif ctx is not None:
        part = model_share(ctx)
    else:
        raise ValueError("a judged ratio needs the context, or the share of the step it applies to")
    share = part * (1.0 - 1.0 / ratio) if ratio > 0 else 0.0
    finding.what_if = gain.what_if.judged(verdict)
    finding.measured = True
    finding.gain_share = share
    finding.est_speedup = round(1.0 / (1.0 - min(share, 0.95)), 3)
    finding.severity = severity_for(share)
    if not verdict.faster:
        finding.severity = "low"
        why = (
            f"not separable from noise here (x{ratio:.2f}, needs over x{1 + max(MIN_GAIN, verdict.noise):.2f})"
            if ratio >= 1 + MIN_GAIN
            else f"no gain (x{ratio:.2f} on the {gain.unit})"
        )
        finding.note = f"Measured on this machine: {why}. {finding.note or ''}"
    elif _changes_numerics(finding) and share < 0.10 and finding.severity != "low":
        finding.severity = "low"
        finding.note = f"It changes numerics and buys under 10% here. {finding.note or ''}"
    finding.note = (finding.note or "").strip() or None


def _changes_numerics(finding: Finding) -> bool:
    from ...speedups.registry import get

    try:
        return finding.speedup is not None and not get(finding.speedup).exact
    except KeyError:
        return False


def cap_to_noise(finding: Finding, ctx: Context) -> None:
    """A gain measured by a single timed comparison (loader rates, a forward with and without autograd, an
    attention by hand and fused) is held to this window's noise floor: one it cannot be told from rates
    ``low``. What is judged is the comparison's own ratio (``pair_ratio``): a 1.6x faster attention
    is not noise because attention is a sixth of the step; the step-level figure is arithmetic on it."""
    what_if = finding.what_if
    if not isinstance(what_if, PairTimed) or what_if.judgement is not None or not ctx.noise_floor:
        return  # a finding judged from interleaved rounds already carries its verdict
    pair = what_if.pair_ratio
    verdict = judge([pair] * what_if.pair_rounds, noise_floor=ctx.noise_floor)
    if not verdict.faster and finding.severity != "low":
        finding.cap(
            "low",
            f"This machine was too noisy during the run to tell the measured x{pair:.2f} from no "
            f"gain (it needs over x{1 + verdict.noise:.2f}).",
        )
