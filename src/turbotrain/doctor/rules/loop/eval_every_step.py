"""`eval-every-step`: validation forwards (autograd off) after every step take over 10% of it: names each line and the
forwards per step (two of the same batch: one serves both).

Reads: run.
"""

from __future__ import annotations

import ast
import dataclasses
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...analysis.periodic import PERIODIC_TARGET_SHARE, SUGGESTED_SHARE, suggested_every
from ...findings import Evidence, Finding, Fix
from ...record.cadence import syntax_tree
from ..common import ATTRIBUTED_SHARE, ms
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...sites import Site


# Validation forwards in at least this share of the measured steps run "every step" (not periodic work).
EVERY_STEP = 0.5


@dataclass(frozen=True)
class EvalEvidence(Evidence):
    forwards_per_step: float
    eval_ms_per_step: float
    share: float
    suggested_every: int
    same_inputs: bool | None = None  # True: the same forward of the same inputs, several times a step


def _eval_seconds_per_step(ctx: Context) -> float:
    measured = set(ctx.measured_steps)
    chosen = [s for s in ctx.step_records if s.index in measured]
    return statistics.fmean(s.phases.get("eval", 0.0) for s in chosen) if chosen else 0.0


def eval_every_step(ctx: Context) -> Iterator[Finding]:
    steps = ctx.measured_steps
    if not steps or not ctx.step_s:
        return
    # Validation the recurring-work rule found a period for is its finding (every other step is a period).
    periodic = {row.site for row in ctx.periodic_rows if row.every}
    stats = [
        s
        for s in ctx.ran_sites("eval_forward")
        if len(set(ctx.tallies[(s.kind, s.site)].by_step) & set(steps)) >= EVERY_STEP * len(steps)
        and s.site not in periodic
    ]
    eval_s = _eval_seconds_per_step(ctx)
    share = eval_s / ctx.step_s
    if not stats or share < ATTRIBUTED_SHARE:
        return
    forwards = sum(s.per_step for s in stats)
    base_s = max(ctx.step_s - eval_s, 1e-9)
    every = suggested_every(eval_s, base_s, 1, SUGGESTED_SHARE)
    for stat in stats:
        part = stat.per_step / forwards
        site_share = share * part
        call = _same_inputs_call(stat.site) if stat.per_step >= 1.5 else None
        cadence = (
            f"evaluate every {every} steps instead of every step (under {PERIODIC_TARGET_SHARE:.0%} of training time)"
        )
        evidence = EvalEvidence(
            forwards_per_step=round(stat.per_step, 3),
            eval_ms_per_step=round(eval_s * 1e3, 3),
            share=round(site_share, 4),
            suggested_every=every,
        )
        if call is not None:
            # The same forward of the same module-level inputs, several times a step: one serves them all.
            f = Finding(
                "eval-every-step",
                site=stat.site,
                category="outside_step",
                message=(
                    f"`{call}` runs {stat.per_step:g} times per step here, after every optimizer step, on the "
                    f"same inputs (names of the module, not of the function): the same output computed "
                    f"{stat.per_step:g} times, {site_share:.0%} of each step ({ms(eval_s * part)})."
                ),
                fix=Fix(
                    f"compute `{call}` once per evaluation and reuse its output for every metric; and {cadence}",
                    lightning=f"Trainer(val_check_interval={every})",
                ),
                evidence=dataclasses.replace(evidence, same_inputs=True),
            )
            f.set_gain(site_share * (1 - 1 / stat.per_step), measured=True)
            f.note = (
                f"The validation forwards are timed in every measured step; the gain is all but one of the "
                f"{stat.per_step:g} forwards (evaluating every {every} steps would save more)."
            )
        else:
            repeated = (
                f" {forwards:g} validation forwards run per step: where they see the same inputs, one "
                "forward's output serves every metric."
                if forwards >= 1.5
                else ""
            )
            f = Finding(
                "eval-every-step",
                site=stat.site,
                category="outside_step",
                message=(
                    f"The model runs {stat.per_step:g} validation forward(s) per step here, after every "
                    f"optimizer step: {site_share:.0%} of each step ({ms(eval_s * part)})." + repeated
                ),
                fix=Fix(
                    f"{cadence}; and compute the evaluation's output once for every metric",
                    lightning=f"Trainer(val_check_interval={every})",
                ),
                evidence=evidence,
            )
            # Every `every` steps instead of every step: all but 1/every of its time goes.
            f.set_gain(site_share * (1 - 1 / every), measured=True)
            f.note = (
                "The validation forwards are timed in every measured step; the gain is that time spread over "
                f"{every} steps."
            )
        yield f


def _same_inputs_call(site: Site) -> str | None:
    """The call at ``site`` (``model(val_x)``) when every argument is a name its function neither takes nor
    assigns: a module-level tensor, the same one at every call."""
    tree = syntax_tree(site.file)
    if tree is None:
        return None
    scopes = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and n.lineno <= site.line <= (n.end_lineno or n.lineno)
    ]
    if not scopes:
        return None
    scope = min(scopes, key=lambda n: (n.end_lineno or n.lineno) - n.lineno)
    local = {a.arg for a in (*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs)}
    local |= {a.arg for a in (scope.args.vararg, scope.args.kwarg) if a is not None}
    local |= {n.id for n in ast.walk(scope) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    calls = [
        n
        for n in ast.walk(scope)
        if isinstance(n, ast.Call)
        and n.lineno == site.line
        and (n.args or n.keywords)
        and isinstance(n.func, (ast.Name, ast.Attribute))
    ]
    for call in calls:
        values = [*call.args, *(k.value for k in call.keywords)]
        if all(isinstance(v, ast.Name) and v.id not in local for v in values):
            return ast.unparse(call)
    return None


RULE = register(Rule("eval-every-step", detect=(Detect("runtime", eval_every_step),)))
