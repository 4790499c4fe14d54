"""The plan search: greedy over the cheap switches, then compile, then what compile changes.

1. The naive plan is timed first; its per-step losses are the numerics reference.
2. Each cheap switch (precision, fused optimizer, layout, ...) is tried on top of the best plan
   so far, those the registry's rules recommend here first. Every comparison is paired: the plan
   it is added to is timed right before it, so both see the same machine load (a shared
   machine's load drifts by multiples within seconds). A switch is kept when it passes the
   numerics guard and is faster by ``min_gain`` in two such pairs (a pair measured through a
   load burst is measured again instead). A close loss is measured again too, and two pairs that
   disagree get a third, which decides.
3. torch.compile (and on CUDA its modes) is tried on top of that: the expensive step, so it
   comes once the cheap wins are in and only when the time left covers a compile.
4. When compile is kept, the switches whose effect compile changes (precision, layout,
   model rewrites) are flipped once more under compile, within the budget: compile and
   AMP together can win where either alone does not.
5. Never slower: the result is timed next to the naive plan once more (twice when time
   allows); unless it is faster, the naive plan is returned and the report says so. The
   speed-ups shown are these paired ratios (chained through the plans each was added to).

Time is measured by a ``measure(plan, steps, warmup) -> Trial`` callable (``run_trial`` on
the user's model in ``tt.tune``), which is also the seam tests use to inject results.
"""

from __future__ import annotations

import dataclasses
import inspect
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..measure import HOPELESS, MIN_GAIN, Trial, judge
from ..plan import Plan
from .candidates import Candidates, Switch
from .guard import DEFAULT_TOLERANCE, check_losses

__all__ = ["Attempt", "SearchResult", "TuneError", "search_plan", "Measure"]

Measure = Callable[..., Trial]
"""``measure(plan, steps, warmup) -> Trial``, optionally with a ``give_up_s=`` keyword (found by inspection)."""

NOISY = 0.5
"""A trial whose step times spread (p10..p90) over half their median was measured through a load burst."""

UNSURE = 0.85
"""A first pair slower than this is a clear loss; between it and ``1 + min_gain`` it is measured again:
one pair on a shared 2-core machine has read bf16 on the GPT as 0.91x where a grid measured 1.09x."""

# Before any compile was seen in this search. Measured on the 2-core CPU: 3-35 s for the small
# reference models with 2 threads, up to 90 s with one thread on a busy machine.
_COMPILE_GUESS_S = {"cpu": 60.0, "cuda": 90.0}
_MIN_STEPS, _MAX_STEPS = 5, 50


class TuneError(RuntimeError):
    """Tuning cannot start (the naive plan itself fails or does not train)."""


@dataclass
class Attempt:
    """One row of the report: a plan that was tried (or not), and what came of it."""

    label: str  # the change tried, e.g. "precision=bf16-mixed"
    plan: Plan
    stage: str  # baseline | switch | compile | under-compile | final
    status: str  # baseline | accepted | rejected | skipped | chosen
    reason: str = ""
    samples_per_s: float = 0.0
    step_s: float | None = None
    speedup: float | None = None  # against the naive plan measured in the same run
    peak_memory_bytes: int | None = None
    compile_s: float | None = None  # first steps' time beyond steady state (None without compile)
    max_deviation: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in self.__dict__.items() if k != "plan"}, "plan": self.plan.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Attempt":
        return cls(**{**data, "plan": Plan.from_dict(data["plan"])})


@dataclass
class SearchResult:
    plan: Plan
    baseline: Plan
    attempts: list[Attempt]
    speedup: float  # chosen vs naive, from every step timed for each
    message: str
    steps: int
    elapsed_s: float
    compile_s: float  # total compile time spent while searching
    samples_per_s: float
    baseline_samples_per_s: float
    left_out: list[tuple[str, str]] = field(default_factory=list)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("inf")


class _Search:
    def __init__(
        self,
        measure: Measure,
        candidates: Candidates,
        base: Plan,
        budget_s: float,
        tolerance: float,
        min_gain: float,
        warmup: int,
        device_type: str,
        clock: Callable[[], float],
    ):
        self.measure, self.candidates, self.base = measure, candidates, base
        self.tolerance, self.min_gain, self.warmup = tolerance, min_gain, warmup
        self.clock = clock
        self.started = clock()
        self.deadline = self.started + budget_s
        self.budget_s = budget_s
        self.compile_guess = _COMPILE_GUESS_S.get(device_type, 60.0)
        self.attempts: list[Attempt] = []
        self.times: dict[Plan, list[float]] = {}  # every steady-state step time seen, per plan
        self.compiled: set[Plan] = set()  # plans whose compile is cached in this process
        self.compile_seen: list[float] = []
        self.steps = _MIN_STEPS  # the first baseline trial sizes the others
        self.samples_per_step = 1
        self.reference: list[float] = []
        self.speedup_of: dict[Plan, float] = {base: 1.0}  # against naive, chained through paired ratios
        self.accepted: list[Plan] = []  # the best plan after each step of the search
        self.recent_step_s: float | None = None  # the latest eager trial's step time
        self._measure_gives_up = "give_up_s" in inspect.signature(measure).parameters

    # -- measuring -------------------------------------------------------------------------

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def _estimate(self, plan: Plan) -> float:
        # From the latest eager trial (the machine's load now, not at the start), with room for a
        # candidate slower than that, plus the model copy.
        step = self.recent_step_s or 1.0
        eager = (self.warmup + self.steps) * step * 1.5 + 0.5
        if plan.compile is not False and plan not in self.compiled:
            return eager + (max(self.compile_seen) * 1.3 if self.compile_seen else self.compile_guess)
        return eager

    def _run(self, plan: Plan, give_up_s: float | None = None) -> Trial:
        if give_up_s is not None and self._measure_gives_up:
            trial = self.measure(plan, self.steps, self.warmup, give_up_s=give_up_s)
        else:
            trial = self.measure(plan, self.steps, self.warmup)
        if trial.ok:
            self.times.setdefault(plan, []).extend(trial.step_times_s)
            if plan.compile is False:
                self.recent_step_s = trial.step_s
            if plan.compile is not False and plan not in self.compiled:
                self.compiled.add(plan)
                self.compile_seen.append(self._compile_s(trial))
        return trial

    def _compile_s(self, trial: Trial) -> float:
        return max(0.0, trial.warmup_s - self.warmup * trial.step_s)

    def median(self, plan: Plan) -> float:
        return _median(self.times.get(plan, []))

    # -- one candidate ---------------------------------------------------------------------

    def _pair(self, against: Plan, plan: Plan) -> tuple[Trial, Trial]:
        """``against`` then ``plan``, back to back: their ratio sees the same machine load. A candidate
        whose steps take HOPELESS times ``against``'s is stopped there (it cannot win)."""
        ref = self._run(against)
        return ref, self._run(plan, give_up_s=HOPELESS * ref.step_s if ref.ok else None)

    @staticmethod
    def _ratio(a: Trial, b: Trial) -> float:
        return a.step_s / b.step_s if a.ok and b.ok else 0.0

    def _paired_ratio(self, against: Plan, plan: Plan) -> float:
        """How many times faster ``plan`` is than ``against`` in one more pair (0 when either fails)."""
        return self._ratio(*self._pair(against, plan))

    def _noisy(self, *trials: Trial) -> bool:
        return any(t.ok and t.spread > NOISY for t in trials)

    def attempt(self, plan: Plan, against: Plan, label: str, stage: str) -> Attempt:
        """Time ``plan`` next to ``against``; accept it when it passes the guard and beats it in two pairs
        (or two of three)."""
        row = Attempt(label=label, plan=plan, stage=stage, status="rejected")
        self.attempts.append(row)
        need = self._estimate(against) + self._estimate(plan)
        # Time for the final side-by-side check (never slower) is kept back from every candidate.
        left = self.remaining() - self._estimate(self.base) - self._estimate(against)
        if need > left:
            row.status = "skipped"
            row.reason = (
                f"time budget (~{need:.0f}s needed; {max(0.0, self.remaining()):.0f}s of the budget left, "
                f"{max(0.0, self.remaining() - max(0.0, left)):.0f}s of it kept for the final check)"
            )
            return row
        ref, trial = self._pair(against, plan)
        row.peak_memory_bytes = trial.peak_memory_bytes
        if plan.compile is not False and trial.ok:
            row.compile_s = self._compile_s(trial)
        if not trial.ok:
            row.reason = (
                f"not faster ({trial.error})"
                if trial.stopped_early
                else f"failed: {trial.error or 'no steps completed'}"
            )
            return row
        row.step_s, row.samples_per_s = trial.step_s, trial.samples_per_s
        verdict = check_losses(self.reference, trial.losses, self.tolerance)
        row.max_deviation = verdict.max_deviation
        if not verdict.ok:
            row.reason = f"numerics: {verdict.reason}"
            return row
        ratios = [self._ratio(ref, trial)]
        # What one more pair costs now: a compiled plan's graph is cached, so no second compile.
        need = self._estimate(against) + self._estimate(plan)
        if self._noisy(ref, trial) and self._can_pair_again(need):
            ratios = [self._paired_ratio(against, plan)]  # the first pair was measured through a load burst
        # A win is measured again before it is believed, and so is a close loss.
        if ratios[0] >= UNSURE and self._can_pair_again(need):
            ratios.append(self._paired_ratio(against, plan))
            wins = [r >= 1 + self.min_gain for r in ratios]
            if wins[0] != wins[1] and self._can_pair_again(need):
                ratios.append(self._paired_ratio(against, plan))  # the two disagree: a third decides
        ratio, won = self._verdict(ratios)
        row.speedup = self.speedup_of.get(against, 1.0) * ratio
        if not won:
            shown = " and ".join(f"{r:.2f}x" for r in ratios)
            row.reason = f"not faster ({shown})" if len(ratios) == 1 else f"not faster when re-measured ({shown})"
            return row
        row.status = "accepted"
        row.reason = f"{ratio:.2f}x the plan before"
        self.speedup_of[plan] = row.speedup
        return row

    def _can_pair_again(self, need: float) -> bool:
        return need <= self.remaining() - self._estimate(self.base)

    def _verdict(self, ratios: list[float]) -> tuple[float, bool]:
        """(speed-up, kept?) from the paired ratios, by the project's one noise model (measure.judge)."""
        verdict = judge(ratios, min_gain=self.min_gain)
        return verdict.speedup, verdict.faster

    def best_of(self, switch: Switch, current: Plan, stage: str, suffix: str = "") -> Plan:
        """Try each value of ``switch`` on top of ``current``; the fastest accepted one wins."""
        winners = []
        for value in switch.values:
            plan = current.replace(**{switch.field: value})
            row = self.attempt(plan, current, f"{switch.field}={value}{suffix}", stage)
            if row.status == "accepted":
                winners.append((self.median(plan), row))
        if not winners:
            return current
        winners.sort(key=lambda w: w[0])
        for _, loser in winners[1:]:
            loser.status = "rejected"
            loser.reason = f"slower than {winners[0][1].label}"
        self.accepted.append(winners[0][1].plan)
        return winners[0][1].plan

    # -- the search ------------------------------------------------------------------------

    def baseline(self) -> None:
        trial = self.measure(self.base, self.steps, self.warmup)
        if not trial.ok:
            raise TuneError(f"the naive plan fails on this model, so there is nothing to tune: {trial.error}")
        try:
            check_losses(trial.losses, trial.losses)
        except ValueError as exc:
            raise TuneError(str(exc)) from None
        self.samples_per_step = trial.samples_per_step
        # Size the trials so each takes about budget/60 seconds (0.5 to 4 s) of steady state.
        target = min(4.0, max(0.5, self.budget_s / 60))
        steps = int(min(_MAX_STEPS, max(_MIN_STEPS, round(target / max(trial.step_s, 1e-6)))))
        first_steps, self.steps = self.steps, steps
        if steps > first_steps:
            trial = self.measure(self.base, self.steps, self.warmup)  # the reference needs as many losses
            if not trial.ok:
                raise TuneError(f"the naive plan fails on this model: {trial.error}")
        self.times[self.base] = list(trial.step_times_s)
        self.recent_step_s = trial.step_s
        self.reference = trial.losses
        self.attempts.append(
            Attempt(
                "naive",
                self.base,
                "baseline",
                "baseline",
                "",
                trial.samples_per_s,
                trial.step_s,
                1.0,
                trial.peak_memory_bytes,
            )
        )

    def run(self) -> SearchResult:
        self.baseline()
        current = self.base
        # The switches the registry's rules recommend are the likeliest wins: time them first, so
        # a tight budget runs out on the long shots (a plan applies switches in registry order anyway).
        cheap = sorted((s for s in self.candidates.timed if not s.expensive), key=lambda s: not s.recommended)
        for switch in cheap:
            current = self.best_of(switch, current, "switch")
        for switch in (s for s in self.candidates.timed if s.expensive):
            current = self.best_of(switch, current, "compile")
        if current.compile is not False:
            for switch in (s for s in cheap if s.interacts_with_compile):
                plain = getattr(self.base, switch.field)
                if getattr(current, switch.field) != plain:  # kept before compile: try it off again
                    switch = dataclasses.replace(switch, values=(plain,))
                current = self.best_of(switch, current, "under-compile", " (under compile)")
        return self.finish()

    def _final_ratio(self, plan: Plan) -> float:
        ratios: list[float] = []
        for _ in range(2):
            if ratios and self._estimate(self.base) + self._estimate(plan) > self.remaining():
                break
            ratios.append(self._paired_ratio(self.base, plan))
        return statistics.geometric_mean(ratios) if min(ratios) > 0 else 0.0

    def finish(self) -> SearchResult:
        refused: list[str] = []
        message, speedup, chosen = "", 1.0, self.base
        # Never slower: the chosen plan is timed next to the naive one once more (twice when time
        # allows). If it does not win there, the plans accepted before it are checked the same way,
        # latest first, so one noisy last step does not throw away the earlier wins.
        for plan in [p for p in reversed(self.accepted) if p != self.base]:
            if refused and self._estimate(self.base) + self._estimate(plan) > self.remaining():
                break
            ratio = self._final_ratio(plan)
            if ratio > 1.0:
                chosen, speedup = plan, ratio
                break
            refused.append(f"{plan.describe()} measured {ratio:.2f}x the naive plan side by side")
        if refused:
            message = "; ".join(refused) + ("; returning the naive plan" if chosen == self.base else "")
        elif chosen == self.base:
            message = "nothing made this model faster on this machine; returning the naive plan"
        for row in self.attempts:
            if row.step_s and row.plan in self.times:  # every step timed for that plan
                row.step_s = self.median(row.plan)
                row.samples_per_s = self.samples_per_step / row.step_s
        if chosen != self.base:
            message = f"{speedup:.2f}x the naive plan: {chosen.describe()}" + (f" ({message})" if message else "")
        chosen_step = self.median(chosen)
        self.attempts.append(
            Attempt(
                f"chosen: {chosen.describe()}",
                chosen,
                "final",
                "chosen",
                "",
                self.samples_per_step / chosen_step,
                chosen_step,
                speedup,
            )
        )
        return SearchResult(
            plan=chosen,
            baseline=self.base,
            attempts=self.attempts,
            speedup=speedup,
            message=message,
            steps=self.steps,
            elapsed_s=self.clock() - self.started,
            compile_s=sum(self.compile_seen),
            samples_per_s=self.samples_per_step / chosen_step,
            baseline_samples_per_s=self.samples_per_step / self.median(self.base),
            left_out=list(self.candidates.left_out),
        )


def search_plan(
    measure: Measure,
    candidates: Candidates,
    base: Plan | None = None,
    time_budget_s: float = 120.0,
    tolerance: float = DEFAULT_TOLERANCE,
    min_gain: float = MIN_GAIN,
    warmup: int = 3,
    device_type: str = "cpu",
    clock: Callable[[], float] = time.monotonic,
) -> SearchResult:
    """Find the fastest plan that passes the numerics guard, within ``time_budget_s`` seconds."""
    return _Search(
        measure, candidates, base or Plan(), time_budget_s, tolerance, min_gain, warmup, device_type, clock
    ).run()
