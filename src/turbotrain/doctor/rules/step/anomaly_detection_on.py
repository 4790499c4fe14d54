"""`anomaly-detection-on`: autograd's anomaly detection left on (`set_detect_anomaly(True)`, `detect_anomaly()`,
`Trainer(detect_anomaly=True)`): on against off timed on your model's step.

Reads: source + run.

A debugging switch that is easy to leave on: PyTorch warns once that it slows training, then says nothing more. The
fix is timed on the captured model: its step with anomaly detection on against off, interleaved.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

import torch

from ....measure import judge
from ...analysis.replay import step_two_ways
from ...analysis.source import is_const, keyword
from ...findings import Finding, Fix
from ...requests import OwnTrial
from ...results import WhatIf
from ..common import sources
from ..rule import Detect, Measured, Rule, TimeLeft, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True, kw_only=True)
class AnomalyResult(WhatIf):
    """The captured model's step with anomaly detection on and off, interleaved (``rounds``: on / off)."""

    kind: ClassVar[str] = "anomaly_detection"
    rounds: tuple[float, ...]
    on_ms: float
    off_ms: float

    def _fields(self) -> dict[str, Any]:
        return {"rounds": list(self.rounds), "on_ms": self.on_ms, "off_ms": self.off_ms}


def _turns_it_on(call: ast.Call, name: str) -> bool:
    """``detect_anomaly(...)`` always; ``set_detect_anomaly(True)`` (or ``mode=True``), not ``(False)``."""
    if name.endswith("detect_anomaly") and not name.endswith("set_detect_anomaly"):
        return True
    mode = call.args[0] if call.args else keyword(call, "mode")
    return is_const(mode, True)


def _switched_on(ctx: Context) -> Iterator[tuple[Any, ast.Call, str]]:
    """(source, call, name as written) of each call that turns anomaly detection on: torch's, or Lightning's
    ``Trainer(detect_anomaly=True)``."""
    for index in sources(ctx):
        for call, name in index.calls("torch.autograd.set_detect_anomaly", "torch.autograd.detect_anomaly"):
            if _turns_it_on(call, name):
                yield index, call, name
        for call, name in index.calls("Trainer"):
            if is_const(keyword(call, "detect_anomaly"), True):
                yield index, call, f"{name}(detect_anomaly=True)"


def anomaly_detection_on(ctx: Context) -> Iterator[Finding]:
    for index, call, name in _switched_on(ctx):
        said = name if name.endswith(")") else f"{name}(...)"
        f = Finding(
            "anomaly-detection-on",
            site=index.site(call),
            category="compute",
            message=(
                f"{said} turns autograd's anomaly detection on: every op of the forward records its Python stack "
                "and every backward op checks its output for NaNs. It is a debugging switch; training pays for it "
                "on every step."
            ),
            fix=Fix(
                "Delete the call (or torch.autograd.set_detect_anomaly(False)); turn it on only to find where a "
                "NaN comes from",
                lightning="Trainer(detect_anomaly=False) (the default)",
            ),
            request=OwnTrial(),
        )
        f.provisional("medium")
        yield f


def measure(ctx: Context, finding: Finding, budget: TimeLeft) -> Measured | None:
    """The captured model's surrogate step with anomaly detection on against off, in interleaved rounds."""
    timed = step_two_ways(ctx, budget.allows, lambda off: torch.autograd.set_detect_anomaly(not off))
    if timed is None:
        return None
    on_s, off_s = timed.as_is_s, timed.changed_s
    return Measured(
        what_if=AnomalyResult(rounds=timed.rounds, on_ms=round(on_s * 1e3, 3), off_ms=round(off_s * 1e3, 3)),
        verdict=judge(timed.rounds, noise_floor=ctx.noise_floor),
        applies_to=min(1.0, ctx.share("compute") + ctx.share("python_overhead")),
        note=f"Timed on your model's step: {on_s * 1e3:.2f} ms with anomaly detection, {off_s * 1e3:.2f} ms without.",
    )


RULE = register(
    Rule("anomaly-detection-on", detect=(Detect("static", anomaly_detection_on),), measure=measure, quick_trial=True)
)
