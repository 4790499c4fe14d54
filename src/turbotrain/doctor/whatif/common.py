"""What every what-if shares: the time budget, the surrogate step on a copy of the user's model, the
rebuilt optimizer and interleaved rounds (a trial's result reaches its finding through :mod:`.outcome`)."""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from ...measure import MIN_GAIN, Trial, run_trial
from ...plan import Plan, Precision
from ..analysis.replay import micro_step_s, surrogate_step

if TYPE_CHECKING:
    from ..analysis.context import Context

log = logging.getLogger("turbotrain")


@dataclass
class Budget:
    """The what-ifs' seconds; ``refused``: the largest cost it turned down since it was last cleared, with the
    seconds left then (what a finding left untimed says)."""

    seconds: float

    def __post_init__(self) -> None:
        self.deadline = time.perf_counter() + self.seconds
        self.refused: tuple[float, float] | None = None  # (cost asked, seconds left)

    @property
    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def allows(self, cost_s: float) -> bool:
        left = self.left
        if left >= cost_s:
            return True
        if self.refused is None or cost_s > self.refused[0]:
            self.refused = (cost_s, max(0.0, left))
        return False


BUDGET_S = 20.0  # the what-ifs' seconds where the script's steps are short
BUDGET_STEPS = 60  # where they are long: this many of them
BUDGET_CAP_S = 180.0


def default_budget_s(step_s: float, compile_s: float = 0.0) -> float:
    """The what-ifs' seconds where the user gave none: 20, or room for 60 steps where the script's are long (a
    trial of a 1.4-s step and its baseline alone take 20 s), or where the script compiled its model for
    ``compile_s`` (its first compiles), room for one fresh compile beside the 20 s: whether compiling pays is
    what a compiled script's report leads with; at most 180."""
    return min(BUDGET_CAP_S, max(BUDGET_S, BUDGET_STEPS * step_s, compile_s + BUDGET_S))


def optimizer_recipe(ctx: Context) -> tuple[type, dict[str, Any]]:
    """The user's optimizer's class and constructor settings (SGD when there is none, or when one rebuilt from its
    defaults cannot step)."""
    model_params = {id(p) for p in ctx.model.parameters()} if ctx.model is not None else set()
    chosen = next(
        (opt for opt, _ in ctx.optimizers if any(id(p) in model_params for g in opt.param_groups for p in g["params"])),
        None,
    )
    if chosen is None:
        return torch.optim.SGD, {"lr": 1e-3}
    cls, defaults = type(chosen), constructor_defaults(chosen)
    try:
        # Built and stepped: an optimizer built from its defaults may still need what its groups carry (nanochat's
        # MuonAdamW reads each group's "kind" in step()).
        device = next((p.device for g in chosen.param_groups for p in g["params"]), None)
        probe = torch.zeros(2, 2, device=device, requires_grad=True)  # on the user's device: capturable=True, fused
        rebuilt = cls([probe], **defaults)
        probe.grad = torch.zeros_like(probe)
        rebuilt.step()
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


TRIAL_S = 0.1  # the least time a what-if trial's timed steps span
MAX_TRIAL_STEPS = 50


class ModelTrials:
    """Baseline and candidate trials on one captured model and batch."""

    def __init__(self, ctx: Context, budget: Budget, model: torch.nn.Module | None = None):
        """``model``: trained in place of the captured module (a compiled one's eager original)."""
        capture = ctx.capture
        assert capture is not None  # every what-if that builds trials checks ctx.capture first
        self.ctx, self.budget = ctx, budget
        self.model = model if model is not None else capture.module
        self.batches = [(capture.args, capture.kwargs)]
        self.optimizer = optimizer_recipe(ctx)  # the user's optimizer, rebuilt for each copy of the model
        cls, settings = self.optimizer
        self.optimizer_fn = lambda params: cls(params, **settings)
        self.base_plan = baseline_plan(ctx)
        self.model_s = micro_step_s(ctx)  # a trial step is one forward and backward of the captured batch
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
    confirm_gain: bool = False,
) -> list[float]:
    """Per-round speed ratios (baseline seconds / candidate seconds), A/B interleaved: two rounds, and a
    third when the two disagree about the direction and the budget allows, or, with ``confirm_gain``, when both
    say faster (a switch that changes numerics is rated on three: one load burst can fake two rounds)."""
    times = [first] if first is not None else []
    while len(times) < 2 and budget.allows(cost):
        got = pair()
        if got is None:
            break
        times.append(got)
    ratios = [b / c for b, c in times if c > 0]
    disagree = len(ratios) == 2 and (ratios[0] > 1) != (ratios[1] > 1)
    both_gain = confirm_gain and len(ratios) == 2 and min(ratios) > 1 + MIN_GAIN
    if (disagree or both_gain) and budget.allows(cost):
        got = pair()
        if got is not None and got[1] > 0:
            ratios.append(got[0] / got[1])
    return ratios
