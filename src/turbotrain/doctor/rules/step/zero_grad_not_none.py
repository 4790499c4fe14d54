"""`zero-grad-not-none`: `zero_grad(set_to_none=False)`, `.grad.zero_()`.

Reads: run, source.
Edit: `zero_grad(set_to_none=True)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...analysis.source import is_const, keyword
from ...edits import EditSpec
from ...findings import Evidence, Finding, Fix, speedup_for_rule
from ...requests import PlanRequest
from ..common import sources, static_finding
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class ZeroGradEvidence(Evidence):
    per_step: float


def zero_grad_not_none(ctx: Context) -> Iterator[Finding]:
    for stat in ctx.ran_sites("zero_grad_zeros"):
        f = Finding(
            "zero-grad-not-none",
            site=stat.site,
            category="optimizer",
            speedup=speedup_for_rule("zero-grad-not-none"),
            message="zero_grad(set_to_none=False) writes zeros into every gradient each step (a memset per "
            "parameter) instead of dropping them.",
            fix=Fix(
                "optimizer.zero_grad() (set_to_none=True is the default since torch 2.0)", plan={"set_to_none": True}
            ),
            evidence=ZeroGradEvidence(per_step=stat.per_step),
            request=PlanRequest({"set_to_none": True}, baseline={"set_to_none": False}),
        )
        f.provisional("low")
        yield f


def zero_grad_static(ctx: Context) -> Iterator[Finding]:
    for index in sources(ctx):
        for call, _ in index.calls("zero_grad"):
            arg = keyword(call, "set_to_none") or (call.args[0] if call.args else None)
            if is_const(arg, False):
                yield static_finding(
                    "zero-grad-not-none",
                    index,
                    call,
                    "zero_grad(set_to_none=False) writes zeros into every gradient instead of dropping it.",
                    Fix("optimizer.zero_grad()", plan={"set_to_none": True}),
                    speedup=speedup_for_rule("zero-grad-not-none"),
                )
        for call, name in index.calls("zero_"):
            if (name.endswith(".grad.zero_") or name.endswith(".grad.data.zero_")) and index.runs_per_step(call):
                yield static_finding(
                    "zero-grad-not-none",
                    index,
                    call,
                    f"{name}() zeroes a gradient in place every step instead of dropping it.",
                    Fix("param.grad = None (or optimizer.zero_grad())", plan={"set_to_none": True}),
                    speedup=speedup_for_rule("zero-grad-not-none"),
                )


def edit(ctx: Context, f: Finding) -> EditSpec:
    return EditSpec("zero_grad", "zero_grad(set_to_none=True)")


RULE = register(
    Rule(
        "zero-grad-not-none",
        detect=(
            Detect("live", zero_grad_not_none),
            Detect("static", zero_grad_static),
        ),
        edit=edit,
    )
)
