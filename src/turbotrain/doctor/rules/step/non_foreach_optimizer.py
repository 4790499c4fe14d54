"""`non-foreach-optimizer`: a per-tensor optimizer loop over many tensors (fused timed).

Reads: optimizer.
Edit: `fused=True` (or `foreach=True`) in the optimizer's constructor; a `foreach=False` becomes `fused=True` in
place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Literal

from ....speedups import fused_optimizer
from ...edits import ByHand, EditSpec
from ...findings import Evidence, Finding, Fix, speedup_for_rule
from ...requests import PlanRequest
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class OptimizerEvidence(Evidence):
    param_tensors: int
    implementation: str  # what its step runs now: "for-loop" (speedups/fused_optimizer.py)
    optimizer_share: float
    switch: Literal["fused", "foreach"]  # the keyword the fix sets


def non_foreach_optimizer(ctx: Context) -> Iterator[Finding]:
    for opt, site in ctx.optimizers:
        if "foreach" not in opt.defaults and "fused" not in opt.defaults:
            continue  # not a torch optimizer with vectorised kernels
        impl = fused_optimizer.implementation(opt)
        n = sum(len(g["params"]) for g in opt.param_groups)
        if impl != "for-loop" or n < 16:
            continue
        fused = fused_optimizer.best_implementation(opt) == "fused"  # what Plan.fused_optimizer would switch to
        share = ctx.timed_share("optimizer")
        f = Finding(
            "non-foreach-optimizer",
            site=site,
            category="optimizer",
            speedup=speedup_for_rule("non-foreach-optimizer"),
            message=(
                f"{type(opt).__name__} updates its {n} parameter tensors one by one (a Python loop of small "
                f"kernels); the optimizer takes {share:.0%} of step time."
            ),
            fix=Fix(
                f"{type(opt).__name__}(..., {'fused=True' if fused else 'foreach=True'})",
                plan={"fused_optimizer": True},
            ),
            evidence=OptimizerEvidence(
                param_tensors=n,
                implementation=impl,
                optimizer_share=round(share, 3),
                switch="fused" if fused else "foreach",
            ),
            request=PlanRequest({"fused_optimizer": True}),
        )
        f.provisional("medium" if share >= 0.2 and n >= 100 else "low")
        yield f


def edit(ctx: Context, f: Finding) -> EditSpec:
    opt = next((o for o, site in ctx.optimizers if site == f.site), None)
    if opt is None:
        raise ByHand("the optimizer the finding names was not seen being built")
    switch, cls = f.evidence_as(OptimizerEvidence).switch, type(opt).__name__
    return EditSpec("optimizer", f"{cls}(..., {switch}=True)", params={"class": cls, "switch": switch})


RULE = register(Rule("non-foreach-optimizer", detect=(Detect("live", non_foreach_optimizer),), edit=edit))
