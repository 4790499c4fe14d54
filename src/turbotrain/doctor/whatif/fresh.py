"""A Plan switch re-timed in fresh processes when the doctor's own process cannot stand in for the user's.

The in-process trials run after the user's script and other trials, on an allocator whose history is not
the training process's (:mod:`turbotrain.fresh_trial` says why that matters). When a trial's steps keep
page-faulting memory in afresh, that history is part of its step time, and the switch is timed again as
the user would run it: the script's setting and the switch each in a process of its own, alternately.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from ...fresh_trial import FreshTrial, FreshTrialError, write_bundle
from ...measure import Trial
from ...plan import Plan
from .. import lifeline
from .common import Budget, ModelTrials, lower_quartile, surrogate_step

if TYPE_CHECKING:
    from ..analysis.context import Context

# Pages mapped in per step above which the allocator's history counts in a step's time (256 pages: 1 MiB a step).
FAULTS_PER_STEP = 256
START_S = 5.0  # two interpreters importing torch at once on a small machine
# The least a turn of one process lasts. A slow spell of the machine lasts seconds: where a turn of a round's steps
# lasts as long, one spell sets the round's ratio; shorter turns spread each round over the whole comparison.
TURN_S = 0.5


def turns(step_s: float, steps: int, rounds: int) -> tuple[int, int]:
    """How ``rounds`` rounds of ``steps`` steps a side are run: (turns a side, steps a turn), the same steps in
    more, shorter turns where a turn of ``steps`` would last over :data:`TURN_S` (one step a turn at least)."""
    per_turn = min(steps, max(1, math.ceil(TURN_S / step_s)))
    return max(rounds, rounds * steps // per_turn), per_turn


def pooled_rounds(base_turns: list[list[float]], plan_turns: list[list[float]], rounds: int) -> list[float]:
    """Round ``j``'s ratio pools turns ``j, j + rounds, j + 2 * rounds, ...`` of each side (lower quartile of
    their steps): every round spans the whole comparison, so a slow spell weighs on all of them alike."""
    return [
        lower_quartile([s for turn in base_turns[j::rounds] for s in turn])
        / lower_quartile([s for turn in plan_turns[j::rounds] for s in turn])
        for j in range(rounds)
    ]


def allocator_churn(*trials: Trial | None) -> float:
    """The most page faults per step among ``trials``: how much their time depends on the allocator."""
    return max((t.page_faults_per_step for t in trials if t is not None), default=0.0)


class FreshProcesses:
    """The fresh processes of one run of the plan what-ifs: the model saved once, the script's setting's
    process kept for every switch compared with it (its allocator only ever serves that setting, as the
    user's would), each switch's own process ended after its rounds. A context manager: nothing outlives it."""

    def __init__(self, ctx: Context, trials: ModelTrials, budget: Budget):
        self.ctx, self.trials, self.budget = ctx, trials, budget
        self._folder: str | None = None
        self._bundle: str | None = None
        self._baselines: list[tuple[Plan, FreshTrial]] = []

    def rounds(self, base: Plan, plan: Plan, rounds: int = 3) -> list[float] | str:
        """Per-round ratios (baseline seconds / candidate seconds) of ``base`` and ``plan``, each trained in a
        process of its own, ``trials.steps`` steps a side a round, in turns A/B alternated (long steps in more,
        shorter turns: :func:`turns`, :func:`pooled_rounds`); or why it could not be done."""
        trials = self.trials
        starting = START_S * (1 if self._kept(base) is None else 0.5)
        if not self.budget.allows(starting + 2 * trials.model_s * (trials.warmup + rounds * trials.steps) * 1.5):
            return "the what-if time budget is spent"
        candidate = None
        try:
            baseline = self._kept(base) or self._start(base, keep=True)
            candidate = self._start(plan, keep=False)
            baseline.ready()
            candidate.ready()  # both load at once
            count, per_turn = turns(trials.model_s, trials.steps, rounds)
            base_turns, plan_turns = [], []
            for _ in range(count):
                base_turns.append(baseline.steps(per_turn))
                plan_turns.append(candidate.steps(per_turn))
            return pooled_rounds(base_turns, plan_turns, rounds)
        except (FreshTrialError, OSError) as exc:  # the in-process figure stands
            self._drop(base)  # a baseline process that failed is not asked again
            return str(exc)
        finally:
            if candidate is not None:
                candidate.close()

    def close(self) -> None:
        for _, child in self._baselines:
            child.close()
        self._baselines.clear()
        if self._folder is not None:
            lifeline.remove(self._folder)
            self._folder = None

    def __enter__(self) -> "FreshProcesses":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _kept(self, base: Plan) -> FreshTrial | None:
        return next((child for plan, child in self._baselines if plan == base), None)

    def _drop(self, base: Plan) -> None:
        for plan, child in self._baselines:
            if plan == base:
                child.close()
        self._baselines = [(plan, child) for plan, child in self._baselines if plan != base]

    def _start(self, plan: Plan, keep: bool) -> FreshTrial:
        child = FreshTrial(
            self._bundle_path(),
            plan,
            script=self.ctx.script,
            warmup=self.trials.warmup,
            timeout_s=max(30.0, self.budget.left),
            clear_grads_before_backward=self.ctx.zero_grad_before_backward,
            extra_env=lifeline.mark(),  # ended with the doctor, whatever ends it
        )
        if keep:
            self._baselines.append((plan, child))
        return child

    def _bundle_path(self) -> str:
        if self._bundle is None:
            self._folder = lifeline.temp_folder("fresh-")
            path = os.path.join(self._folder, "trial.pt")
            try:
                write_bundle(path, self.trials.model, self.trials.batches, self.trials.optimizer, surrogate_step)
            except Exception as exc:  # an unpicklable model (a local class, a lambda attribute)
                raise FreshTrialError(
                    f"the model cannot be saved for another process ({type(exc).__name__}: {exc})"
                ) from exc
            self._bundle = path
        return self._bundle
