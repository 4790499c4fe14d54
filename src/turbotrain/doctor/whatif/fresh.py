"""A Plan switch re-timed in fresh processes when the doctor's own process cannot stand in for the user's.

The in-process trials run after the user's script and other trials, on an allocator whose history is not
the training process's (:mod:`turbotrain.fresh_trial` says why that matters). When a trial's steps keep
page-faulting memory in afresh, that history is part of its step time, and the switch is timed again as
the user would run it: the script's setting and the switch each in a process of its own, alternately.
"""

from __future__ import annotations

import os
import tempfile

from ...fresh_trial import FreshTrial, FreshTrialError, write_bundle
from ...measure import Trial
from ...plan import Plan
from .common import Budget, ModelTrials, lower_quartile, surrogate_step

# Pages mapped in per step above which the allocator's history counts (256 pages: 1 MiB a step, about
# 0.3-0.5 ms on the 2-core EPYC where bf16's 1,700 faults per step cost 3 ms).
FAULTS_PER_STEP = 256
START_S = 5.0          # two interpreters importing torch at once on a small machine


def allocator_churn(*trials: Trial | None) -> float:
    """The most page faults per step among ``trials``: how much their time depends on the allocator."""
    return max((t.page_faults_per_step for t in trials if t is not None), default=0.0)


def fresh_rounds(ctx, trials: ModelTrials, budget: Budget, base: Plan, plan: Plan, rounds: int = 3
                 ) -> list[float] | str:
    """Per-round ratios (baseline seconds / candidate seconds) of ``base`` and ``plan``, each trained in a
    process of its own, ``trials.steps`` steps a turn, A/B alternated; or why it could not be done."""
    if not budget.allows(START_S + 2 * trials.model_s * (trials.warmup + rounds * trials.steps) * 1.5):
        return "the what-if time budget is spent"
    with tempfile.TemporaryDirectory(prefix="turbotrain-fresh-") as folder:
        bundle = os.path.join(folder, "trial.pt")
        try:
            write_bundle(bundle, trials.model, trials.batches, trials.optimizer, surrogate_step)
        except Exception as exc:  # noqa: BLE001 - an unpicklable model: the in-process figure stands
            return f"the model cannot be saved for another process ({type(exc).__name__}: {exc})"
        pair: list[FreshTrial] = []
        try:
            for setting in (base, plan):
                pair.append(FreshTrial(bundle, setting, script=ctx.script, warmup=trials.warmup,
                                       timeout_s=max(30.0, budget.left)))
            for child in pair:
                child.ready()  # both load at once
            ratios = []
            for _ in range(rounds):
                base_s, plan_s = (lower_quartile(child.steps(trials.steps)) for child in pair)
                ratios.append(base_s / plan_s)
            return ratios
        except (FreshTrialError, OSError) as exc:  # the in-process figure stands
            return str(exc)
        finally:
            for child in pair:
                child.close()
