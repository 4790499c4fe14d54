"""No unexplained share: every phase over a tenth of the step that is not the training step's own work (the
model's forward and backward, their dispatch, the optimizer's update) ends in a finding with a line of the
user's code, or in one that says plainly what could not be attributed, and why.

``eval-every-step`` names the validation forwards that run after every optimizer step (no autograd: the
autograd-on kind is ``grad-in-validation``'s). ``unattributed-time`` holds, for each such phase, the best line
the run knows and why nothing finer was found; :func:`explained` drops it wherever another finding of the same
phase already points at a line.
"""

from __future__ import annotations

import ast
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from ..analysis.periodic import PERIODIC_TARGET_SHARE, SUGGESTED_SHARE, periodic_table, suggested_every
from ..findings import Finding, Fix
from .registry import rule

if TYPE_CHECKING:
    from ..analysis.context import Context
    from ..sites import Site

__all__ = ["explained", "ATTRIBUTED_SHARE"]

# A phase over this share of the step must be explained by a finding with a line.
ATTRIBUTED_SHARE = 0.10
# Validation forwards in at least this share of the measured steps run "every step" (not periodic work).
EVERY_STEP = 0.5
# The training step's own work: the model's forward and backward, their dispatch (jit-script's) and the update
# (timed inside optimizer.step(), whose line the breakdown names).
_OWN_WORK = ("compute", "python_overhead", "optimizer")
_GAP_SAMPLED_FROM_S = 1e-3  # the recorder samples untimed batch building from a millisecond a step


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


def _eval_seconds_per_step(ctx: Context) -> float:
    measured = set(ctx.measured_steps)
    chosen = [s for s in ctx.step_records if s.index in measured]
    return statistics.fmean(s.phases.get("eval", 0.0) for s in chosen) if chosen else 0.0


@rule("eval-every-step", "runtime")
def eval_every_step(ctx: Context) -> Iterator[Finding]:
    steps = ctx.measured_steps
    if not steps or not ctx.step_s:
        return
    # Validation the recurring-work rule found a period for is its finding (every other step is a period).
    periodic = {row["site"] for row in periodic_table(ctx) if row["every"]}
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
        evidence = {
            "forwards_per_step": round(stat.per_step, 3),
            "eval_ms_per_step": round(eval_s * 1e3, 3),
            "share": round(site_share, 4),
            "suggested_every": every,
        }
        if call is not None:
            # The same forward of the same module-level inputs, several times a step: one serves them all.
            f = Finding(
                "eval-every-step",
                site=stat.site,
                category="outside_step",
                message=(
                    f"`{call}` runs {stat.per_step:g} times per step here, after every optimizer step, on the "
                    f"same inputs (names of the module, not of the function): the same output computed "
                    f"{stat.per_step:g} times, {site_share:.0%} of each step ({_ms(eval_s * part)})."
                ),
                fix=Fix(
                    f"compute `{call}` once per evaluation and reuse its output for every metric; and {cadence}",
                    lightning=f"Trainer(val_check_interval={every})",
                ),
                evidence={**evidence, "same_inputs": True},
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
                    f"optimizer step: {site_share:.0%} of each step ({_ms(eval_s * part)})." + repeated
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
    try:
        tree = ast.parse(Path(site.file).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
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


def _why_data(ctx: Context) -> tuple[Site | None, str]:
    record = ctx.main_loader
    if record is not None:
        return record.site, "the step waits on this DataLoader"
    gap = ctx.seconds("data_loading")
    site = ctx.capture.site if ctx.capture is not None else None
    if ctx.gap_samples:
        busiest = max(ctx.gap_samples.items(), key=lambda kv: kv[1])[0]
        return busiest, (
            "this line was caught running most often in the untimed time before the step's forward "
            "(which is charged to data loading), and no rule has a fix for it"
        )
    if gap < _GAP_SAMPLED_FROM_S:
        why = (
            f"each step spends {_ms(gap)} before this forward with no timed call (building the batch in the "
            "loop: indexing, random draws), under the millisecond from which the doctor samples which line "
            "runs there"
        )
    else:
        why = (
            "the time before this forward ran in no timed call and the sampler caught no line of yours in it "
            "(it ran in a library's code)"
        )
    return site, why


def _why(ctx: Context, category: str) -> tuple[Site | None, str]:
    """The best line the run knows for ``category``'s time, and why nothing finer was found."""
    if category == "data_loading":
        return _why_data(ctx)
    kinds = {
        "outside_step": ("eval_forward", "eval_grad_forward", "save"),
        "host_sync": ("sync:",),
        "host_to_device": ("h2d",),
    }.get(category, ())
    for kind in kinds:
        stats = ctx.ran_sites(kind)
        if stats:
            return stats[0].site, "the time is the calls at this line and its like"
    return None, "no call of your code was timed in it (the time ran between the hooks the doctor installs)"


@rule("unattributed-time", "runtime")
def unattributed_time(ctx: Context) -> Iterator[Finding]:
    if not ctx.step_s:
        return
    for category, share in sorted(ctx.breakdown.shares.items(), key=lambda kv: -kv[1]):
        if category in _OWN_WORK or share < ATTRIBUTED_SHARE:
            continue
        site, why = _why(ctx, category)
        label = category.replace("_", " ")
        f = Finding(
            "unattributed-time",
            site=site,
            category=category,
            message=(
                f"{share:.0%} of each step ({_ms(ctx.seconds(category))}) is {label} that no finding explains: {why}."
            ),
            fix=Fix(
                "no measured fix: look at the line above, or run with --trace and open the trace to see what runs there"
            ),
            evidence={"share": round(share, 4), "ms_per_step": round(ctx.seconds(category) * 1e3, 3)},
        )
        f.provisional("low")
        yield f


def explained(findings: list[Finding]) -> list[Finding]:
    """``unattributed-time`` findings less those whose phase another finding already ties to a line."""
    covered = {
        f.category
        for f in findings
        if f.rule != "unattributed-time" and f.source != "static" and (f.site is not None or f.where)
    }
    return [f for f in findings if f.rule != "unattributed-time" or f.category not in covered]
