"""What every what-if shares: the time budget, the surrogate step on a copy of the user's model, the
rebuilt optimizer, interleaved rounds and turning a judged ratio into the finding's share of the step."""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from ...measure import MIN_GAIN, Comparison, Trial, run_trial
from ...plan import Plan, Precision
from ..analysis.replay import surrogate_step
from ..findings import Finding, severity_for
from ..results import WhatIf

if TYPE_CHECKING:
    from ..analysis.context import Context

log = logging.getLogger("turbotrain")


@dataclass
class Budget:
    seconds: float

    def __post_init__(self) -> None:
        self.deadline = time.perf_counter() + self.seconds

    @property
    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def allows(self, cost_s: float) -> bool:
        return self.left >= cost_s


def optimizer_recipe(ctx: Context) -> tuple[type, dict[str, Any]]:
    """The user's optimizer's class and constructor settings (SGD when there is none, or when it cannot be
    rebuilt from its defaults)."""
    model_params = {id(p) for p in ctx.model.parameters()} if ctx.model is not None else set()
    chosen = next(
        (opt for opt, _ in ctx.optimizers if any(id(p) in model_params for g in opt.param_groups for p in g["params"])),
        None,
    )
    if chosen is None:
        return torch.optim.SGD, {"lr": 1e-3}
    cls, defaults = type(chosen), constructor_defaults(chosen)
    try:
        cls([torch.zeros(1, requires_grad=True)], **defaults)
    except Exception:  # noqa: BLE001 - a custom optimizer whose defaults are not constructor arguments
        lr = defaults.get("lr", 1e-3)
        log.warning(
            "turbotrain doctor: %s cannot be rebuilt from its defaults; the what-ifs time SGD instead", cls.__name__
        )
        return torch.optim.SGD, {"lr": float(lr) if not torch.is_tensor(lr) else lr.item()}
    return cls, defaults


def constructor_defaults(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's ``defaults`` that its constructor accepts. torch's own AdamW keeps a
    ``decoupled_weight_decay`` entry it does not take as an argument (torch 2.13): passing every
    default would make the rebuild fail and the what-ifs time some other optimizer."""
    params = inspect.signature(type(optimizer).__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in params}


def baseline_plan(ctx: Context) -> Plan:
    facts = ctx.facts
    precision: Precision = "fp32"
    if facts.autocast:
        precision = (
            "fp16-mixed"
            if "float16" in str(facts.autocast_dtype) and "b" not in str(facts.autocast_dtype)
            else "bf16-mixed"
        )
    zeros = bool(ctx.ran_sites("zero_grad_zeros"))
    return Plan(
        device=ctx.device,
        precision=precision,
        set_to_none=not zeros,
        channels_last=bool(facts.input_channels_last),
        cudnn_benchmark=bool(facts.cudnn_benchmark),
    )


def typical_s(trial: Trial) -> float:
    """A trial's step time robust to interference: the lower quartile of its steps (other processes only ever
    add time, and on a busy machine most steps of a short trial may carry some). Not the fastest step: a
    switch whose step time varies by itself would be credited with its luckiest step, which a training run
    does not get (where the variation is the allocator's history, see :mod:`.fresh`)."""
    return lower_quartile(trial.step_times_s)


def lower_quartile(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[(len(ordered) - 1) // 4] if ordered else float("inf")


def model_share(ctx: Context) -> float:
    return ctx.share("compute") + ctx.share("optimizer") + ctx.share("python_overhead")


def changes_numerics(finding: Finding) -> bool:
    from ...speedups.registry import get

    try:
        return finding.speedup is not None and not get(finding.speedup).exact
    except KeyError:
        return False


def apply_ratio(
    finding: Finding,
    ctx: Context | None,
    verdict: Comparison,
    what_if: WhatIf,
    unit: str = "model's step time",
    applies_to: float | None = None,
) -> None:
    """Turn a judged speed ratio of the model's step (:func:`turbotrain.measure.judge`) into the finding's
    share of the whole step.

    A ratio the noise model cannot separate from 1.0 (the rounds' own spread, or this window's noise
    floor: another process busy, steps spread wide) counts as no gain and rates ``low``, whatever it
    reads; a switch that changes numerics must buy at least 10% to rate above ``low``.
    """
    ratio = verdict.speedup
    if applies_to is not None:
        part = applies_to
    elif ctx is not None:
        part = model_share(ctx)
    else:
        raise ValueError("apply_ratio needs the context, or the share of the step the ratio applies to")
    share = part * (1.0 - 1.0 / ratio) if ratio > 0 else 0.0
    finding.what_if = what_if.judged(verdict)
    finding.measured = True
    finding.gain_share = share
    finding.est_speedup = round(1.0 / (1.0 - min(share, 0.95)), 3)
    finding.severity = severity_for(share)
    if not verdict.faster:
        finding.severity = "low"
        why = (
            f"not separable from noise here (x{ratio:.2f}, needs over x{1 + max(MIN_GAIN, verdict.noise):.2f})"
            if ratio >= 1 + MIN_GAIN
            else f"no gain (x{ratio:.2f} on the {unit})"
        )
        finding.note = f"Measured on this machine: {why}. {finding.note or ''}"
    elif changes_numerics(finding) and share < 0.10 and finding.severity != "low":
        finding.severity = "low"
        finding.note = f"It changes numerics and buys under 10% here. {finding.note or ''}"
    finding.note = (finding.note or "").strip() or None


TRIAL_S = 0.1  # the least time a what-if trial's timed steps span
MAX_TRIAL_STEPS = 50


class ModelTrials:
    """Baseline and candidate trials on one captured model and batch."""

    def __init__(self, ctx: Context, budget: Budget):
        capture = ctx.capture
        assert capture is not None  # every what-if that builds trials checks ctx.capture first
        self.ctx, self.budget = ctx, budget
        self.model = capture.module
        self.batches = [(capture.args, capture.kwargs)]
        self.optimizer = optimizer_recipe(ctx)  # the user's optimizer, rebuilt for each copy of the model
        cls, settings = self.optimizer
        self.optimizer_fn = lambda params: cls(params, **settings)
        self.base_plan = baseline_plan(ctx)
        self.model_s = max(1e-4, ctx.seconds("compute") + ctx.seconds("optimizer") + ctx.seconds("python_overhead"))
        # At least TRIAL_S of steps a trial (up to MAX_TRIAL_STEPS): a few very short steps misread a switch's gain.
        self.steps = int(min(MAX_TRIAL_STEPS, max(3, min(10, 0.8 / self.model_s), TRIAL_S / self.model_s)))
        self.warmup = 2
        self.cost = (self.steps + self.warmup) * self.model_s * 1.5 + 0.05
        self.baselines: list[Trial] = []

    def trial(self, plan: Plan, batches=None, warmup: int | None = None, give_up_s: float | None = None) -> Trial:
        return run_trial(
            self.model,
            self.optimizer_fn,
            None,
            batches or self.batches,
            plan,
            steps=self.steps,
            warmup=warmup or self.warmup,
            step_fn=surrogate_step,
            give_up_s=give_up_s,
        )

    def baseline(self) -> Trial | None:
        if not self.budget.allows(self.cost):
            return None
        trial = self.trial(self.base_plan)
        if trial.ok:
            self.baselines.append(trial)
        return trial

    @property
    def base_s(self) -> float:
        # The faster baseline: a gain is never credited to the machine getting busier meanwhile.
        return min(typical_s(t) for t in self.baselines) if self.baselines else float("inf")


def interleaved_rounds(
    ctx: Context,
    budget: Budget,
    cost: float,
    first: tuple[float, float] | None,
    pair: Callable[[], tuple[float, float] | None],
) -> list[float]:
    """Per-round speed ratios (baseline seconds / candidate seconds), A/B interleaved: two rounds, and a
    third when the two disagree about the direction and the budget allows."""
    times = [first] if first is not None else []
    while len(times) < 2 and budget.allows(cost):
        got = pair()
        if got is None:
            break
        times.append(got)
    ratios = [b / c for b, c in times if c > 0]
    if len(ratios) == 2 and (ratios[0] > 1) != (ratios[1] > 1) and budget.allows(cost):
        got = pair()
        if got is not None and got[1] > 0:
            ratios.append(got[0] / got[1])
    return ratios
