"""Measured, not guessed: short what-if trials on the user's own model, batch and DataLoader.

* Plan switches (mixed precision, channels_last, foreach/fused optimizer, set_to_none, conv bias
  removal, cudnn.benchmark, compile) run through :func:`turbotrain.measure.run_trial` on a copy
  of the captured model and batch, against a baseline that reproduces the script's own
  settings, timed before and after the candidates (the slower machine state is not credited).
  The loss is a surrogate (the mean square of the model's float outputs: bounded, so a few
  steps of it never diverge): the model's forward and backward are what is timed, not the
  user's loss.
* A larger batch: samples/s at a multiple of the captured batch.
* ``num_workers`` 0, 1, 2, ... with :func:`turbotrain.measure.time_loader` until it stops improving.
* Validation with autograd on: the captured model's eval forward with and without autograd.
* Hand-written attention: the user's attention shapes timed by hand and as
  ``scaled_dot_product_attention``.

A trial's gain is turned into a share of the user's step (Amdahl: only the part of the step the
trial models gets faster), which sets the finding's severity and ``est_speedup``.

The package: ``common`` (budget, surrogate step, interleaved rounds, ratio to share), ``switches``
(Plan switches, batch size), ``settings`` (threads, workers), ``single`` (one part of the step timed
two ways); this module runs them in order.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import types
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, cast

from ..findings import Finding, one_line
from ..requests import (
    AttentionRequest,
    BatchBuildRequest,
    BatchRequest,
    EvalGradRequest,
    LoaderRequest,
    OwnTrial,
    PlanRequest,
    ThreadsRequest,
)
from ..rules import by_id
from .outcome import Judged, Note, Outcome, attach, cap_to_noise
from .common import Budget
from .switches import batch_trial, plan_trials
from .settings import loader_trial, threads_trial
from .single import attention_trial, eval_grad_trial
from .batch_building import batch_build_trial

if TYPE_CHECKING:
    from ..analysis.context import Context

__all__ = ["run_what_ifs", "script_as_main", "Budget"]

log = logging.getLogger("turbotrain")


@contextlib.contextmanager
def script_as_main(ctx: Context) -> Iterator[None]:
    """The user's script back as ``__main__`` while its model is re-run: runpy restored the doctor's own
    ``__main__`` when the script ended, and torch.compile resolves a class defined in the script
    through ``sys.modules["__main__"]``."""
    model = ctx.capture.module if ctx.capture is not None else None
    # Any layer the script defined counts: an nn.Sequential (torch's class) of the script's own modules too.
    mine = next((m for m in (model.modules() if model is not None else ()) if type(m).__module__ == "__main__"), None)
    script_globals = getattr(getattr(type(mine), "forward", None), "__globals__", None)
    if mine is None or not script_globals:
        yield
        return
    saved = sys.modules.get("__main__")
    stand_in = types.ModuleType("__main__")
    stand_in.__dict__.update(script_globals)
    sys.modules["__main__"] = stand_in
    try:
        yield
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def run_what_ifs(ctx: Context, findings: list[Finding], budget_s: float = 30.0, allow_compile: bool = False) -> None:
    """Measure what the findings' fixes buy (in place), within ``budget_s`` seconds."""
    with script_as_main(ctx):
        _run_what_ifs(ctx, findings, budget_s, allow_compile)


def _own_trial(ctx: Context, finding: Finding, budget: Budget) -> Outcome | None:
    """``finding`` timed by its rule's measurer (:attr:`Rule.measure`)."""
    rule = by_id(finding.rule)
    if rule.measure is None:
        raise ValueError(f"rule {rule.id} asked for its own trial (OwnTrial) but declares no measure")
    measured = rule.measure(ctx, finding, budget)
    if measured is None:
        return None
    return Outcome(
        Judged(measured.what_if, measured.verdict, applies_to=measured.applies_to, unit=measured.unit),
        before=(Note(measured.note),) if measured.note else (),
        fix=measured.fix,
        low=measured.low,
    )


# A what-if: the outcome of each finding it timed, as it timed it.
Trial = Callable[[], Iterable[tuple[Finding, "Outcome | None"]]]


def _one(
    finding: Finding, trial: Callable[[Context, Finding, Budget], Outcome | None], ctx: Context, budget: Budget
) -> Trial:
    return lambda: [(finding, trial(ctx, finding, budget))]


EARLY_SHARE = 0.25  # of the what-if budget: the most a quick rule trial may take before the plan's trials


def _early(finding: Finding, ctx: Context, budget: Budget) -> Trial:
    """A quick rule trial with a quarter of the budget at most: one that needs more (a long step) is left to its
    turn after the others, so the plan's trials, where the large gains usually are, are not starved by it."""

    def run() -> list[tuple[Finding, Outcome | None]]:
        outcome = _own_trial(ctx, finding, Budget(min(budget.left, EARLY_SHARE * budget.seconds)))
        return [(finding, outcome)] if outcome is not None else []

    return run


def _unless_timed(finding: Finding, trial: Trial) -> Trial:
    return lambda: [] if finding.what_if is not None else trial()


def _run_what_ifs(ctx: Context, findings: list[Finding], budget_s: float, allow_compile: bool) -> None:
    budget = Budget(budget_s)

    def of(kind: type) -> list[Finding]:
        return [f for f in findings if isinstance(f.request, kind)]

    # Each trial with the findings it is for.
    steps: list[tuple[str, Trial, list[Finding]]] = []
    for f in of(ThreadsRequest):  # first: on a contended machine every other trial is skewed by it
        steps.append(("threads", _one(f, threads_trial, ctx, budget), [f]))
    for f in of(OwnTrial):  # a rule trial the run shows large: before the others spend the budget
        if cast(OwnTrial, f.request).first:
            steps.append((f.rule, _one(f, _own_trial, ctx, budget), [f]))
    for f in of(LoaderRequest):
        steps.append(("num_workers", _one(f, loader_trial, ctx, budget), [f]))
    for f in of(BatchBuildRequest):  # a second or so each: before the long trials take the budget
        steps.append(("batch_build", _one(f, batch_build_trial, ctx, budget), [f]))
    for f in of(BatchRequest):
        steps.append(("batch", _one(f, batch_trial, ctx, budget), [f]))
    quick = [f for f in of(OwnTrial) if by_id(f.rule).quick_trial and not cast(OwnTrial, f.request).first]
    for f in quick:  # a few of the model's steps each: before the plan's fresh processes take the budget
        steps.append((f.rule, _early(f, ctx, budget), [f]))
    if of(PlanRequest):
        steps.append(("plan", lambda: plan_trials(ctx, of(PlanRequest), budget, allow_compile), of(PlanRequest)))
    for f in of(AttentionRequest):
        steps.append(("attention", _one(f, attention_trial, ctx, budget), [f]))
    for f in of(EvalGradRequest):
        steps.append(("eval_grad", _one(f, eval_grad_trial, ctx, budget), [f]))
    for f in of(OwnTrial):  # a rule that times its own fix (Rule.measure); a quick one the early slot could not hold
        steps.append((f.rule, _unless_timed(f, _one(f, _own_trial, ctx, budget)), [f]))
    refused: dict[int, tuple[float, float]] = {}  # a finding its trial gave no outcome: the cost the budget refused
    started = 0  # the trials begun, in order: those after them the budget never reached
    for name, trial, _ in steps:
        if budget.left <= 0:
            break
        started += 1
        budget.refused = None
        try:
            for finding, outcome in trial():
                attach(finding, ctx, outcome)
                if outcome is None and budget.refused is not None:
                    refused[id(finding)] = budget.refused
                budget.refused = None
        except Exception as exc:  # noqa: BLE001 - a failed what-if leaves the finding estimated
            log.warning("turbotrain doctor: what-if %s failed: %s", name, one_line(exc))
    not_reached = {id(f) for _, _, left_out in steps[started:] for f in left_out}
    replayed = {id(f) for f in findings if f.measured and isinstance(f.request, (PlanRequest, BatchRequest))}
    others = _also_trained(ctx) if replayed else []
    for f in findings:
        if f.measured and f.what_if is not None:
            cap_to_noise(f, ctx)
            if others and id(f) in replayed:
                f.note = f"{(f.note or '').strip()} {_one_of(ctx, others)}".strip()
        elif f.what_if is None and (id(f) in refused or id(f) in not_reached):
            _say_untimed(f, refused.get(id(f)), budget_s)


def _named(ctx: Context, module: object) -> str:
    """``Sequential (train.py:23)``: its class, and the line that built it where that is the user's."""
    site = ctx.module_sites.get(id(module))
    where = ctx.where(site) if site is not None else None
    return f"{type(module).__name__}{f' ({where})' if where else ''}"


def _also_trained(ctx: Context) -> list[str]:
    """The other outermost modules the step trains beside the captured one (a GAN's generator beside the
    discriminator the doctor replays), named."""
    model = ctx.capture.module if ctx.capture is not None else None
    if model is None:
        return []
    trained = {id(p) for opt, _ in ctx.optimizers for group in opt.param_groups for p in group["params"]}
    return [_named(ctx, m) for m in ctx.modules if m is not model and any(id(p) in trained for p in m.parameters())]


def _one_of(ctx: Context, others: list[str]) -> str:
    """What a figure timed on the captured model alone leaves out."""
    model = ctx.capture.module if ctx.capture is not None else None
    return (
        f"Timed on {_named(ctx, model)} alone, the model the doctor replays; the step also trains "
        f"{', '.join(others)}, whose part of the gain is not in this figure."
    )


def _say_untimed(f: Finding, refused: tuple[float, float] | None, budget_s: float) -> None:
    """A finding whose trial the budget refused, or never reached, says so, with the budget that gives it room."""
    if refused is not None:
        cost, left = refused
        said = f"its trial needed about {cost:.0f} s and {left:.0f} s of the what-if budget were left"
        room = budget_s - left + cost  # what was spent before its turn, and its own cost
    else:
        said = f"the what-if budget ({budget_s:.0f} s) was spent before its trial's turn"
        room = 2 * budget_s
    room = max(10 * math.ceil(room / 10), budget_s + 10)
    f.note = f"{(f.note or '').strip()} Not timed: {said}; `--what-if-budget {room:.0f}` gives it room.".strip()
