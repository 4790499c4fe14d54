"""The plan search: from the rules' plan, remove what does not pay, add what does.

1. The naive plan is timed first; its per-step losses are the numerics reference, its step time
   sizes the trials and, when no budget is given, the budget.
2. The rules' plan (every timed switch the registry's rules pick here: what ``Plan.fast`` would
   set) is timed next to the naive plan. Starting from the best guess spends the budget where the
   big wins are: on a GPU, bf16 and compile, which a greedy walk from the naive plan reached last.
3. Ablation: each switch of the rules' plan is taken out once (compile first: its removal is the
   largest change and the cheapest trial), and stays out when the plan without it is faster; compile
   also when it is not faster with it (it must win as an addition must: a tie costs a compile a run).
4. Additions: every other timed value (a switch the rules leave off, another precision, another
   compile mode) is tried on top of the plan so far, cheap ones first, then the compiles; the
   compiles first when the budget left cannot hold both. A pair already timed is not timed again.
5. When compile came in as an addition, the switches whose effect compile changes (precision,
   layout, model rewrites) are flipped once more under it.
6. Never slower than the rules or the naive plan: the result is timed next to both once more and
   the fastest of the three is returned, the report saying which won and why.

Every comparison is paired (the plan a change is made to is timed right before the candidate, so
both see the same machine load); a change is kept when it passes the numerics guard and is faster
by ``min_gain`` in two pairs (``measure.judge``). Compile is priced honestly: its warm-up is
measured once per plan (later trials reuse the compiled graph), and with a run length
(``run_steps``) a compiled plan must also win once its compile is spread over that run; each
compiled row says from which step its compile pays.

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

from ..measure import HOPELESS, MIN_GAIN, SLOWER, Trial, judge
from ..plan import CompileMode, Plan
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
# reference models with 2 threads, up to 90 s with one thread on a busy machine; on an H100 and an
# H200, 19-21 s for GPT-2 124M and 37-44 s for ResNet-50, cold.
_COMPILE_GUESS_S = {"cpu": 60.0, "cuda": 45.0}
_MIN_STEPS, _MAX_STEPS = 5, 50
_AUTO_BUDGET_S = (30.0, 900.0)  # a derived budget's floor and ceiling


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
    pays_after_steps: float | None = None  # compile only: steps after which its saving repays its compile

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
    notes: list[str] = field(default_factory=list)  # said before the table: a budget too small, the path timed
    rules: Plan | None = None  # the rules' plan the search started from (None: the rules pick nothing here)
    budget_s: float = 0.0  # the search's budget (derived from the first measurements when none was given)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("inf")


class _Search:
    def __init__(
        self,
        measure: Measure,
        candidates: Candidates,
        base: Plan,
        budget_s: float | None,
        tolerance: float,
        min_gain: float,
        warmup: int,
        device_type: str,
        clock: Callable[[], float],
        run_steps: int | None = None,
    ):
        self.measure, self.candidates, self.base = measure, candidates, base
        self.tolerance, self.min_gain, self.warmup = tolerance, min_gain, warmup
        self.clock = clock
        self.started = clock()
        self.given_budget = budget_s
        self.budget_s = budget_s if budget_s is not None else 0.0  # derived after the baseline when None
        self.deadline = self.started + (budget_s if budget_s is not None else float("inf"))
        self.run_steps = run_steps
        self.compile_guess = _COMPILE_GUESS_S.get(device_type, 60.0)
        self.attempts: list[Attempt] = []
        self.notes: list[str] = []
        self.times: dict[Plan, list[float]] = {}  # every steady-state step time seen, per plan
        self.compiled: set[Plan] = set()  # plans whose compile is cached in this process
        self.compile_seen: list[float] = []
        self.compile_of: dict[Plan, float] = {}  # each compiled plan's own compile seconds (its first trial)
        self.steps = _MIN_STEPS  # the first baseline trial sizes the others
        self.samples_per_step = 1
        self.reference: list[float] = []
        self.speedup_of: dict[Plan, float] = {base: 1.0}  # against naive, chained through paired ratios
        self.accepted: list[Plan] = []  # the best plan after each step of the search
        self.recent_step_s: float | None = None  # the latest eager trial's step time
        self.rules: Plan | None = None
        self.rules_ok = False  # the rules' plan ran and passed the numerics guard
        # The rules' compile, when the budget could not time it: kept as the rules pick it, untimed, unless a
        # compiled plan is timed later. Dropping it would return a plan slower than Plan.fast for want of time.
        self.untimed_compile: bool | CompileMode | None = None
        self.ablated: set[tuple[str, Any]] = set()  # (field, value) the ablation took out: not added back
        # (against, plan) pairs already timed: an addition equal to the rules' plan is not timed a second time.
        self.judged: set[tuple[Plan, Plan]] = set()
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
                self.compile_of[plan] = self._compile_s(trial)
                self.compile_seen.append(self.compile_of[plan])
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
        (or two of three), and, where compile differs between the two, over the run's length too."""
        row = Attempt(label=label, plan=plan, stage=stage, status="rejected")
        self.attempts.append(row)
        need = self._estimate(against) + self._estimate(plan)
        # Time for the final side-by-side checks (never slower) is kept back from every candidate but the
        # rules' plan, whose pair with the naive plan is itself the check the final one repeats.
        held = 0.0 if stage == "rules" else self._estimate(self.base) + self._estimate(against)
        left = self.remaining() - held
        if need > left:
            row.status = "skipped"
            row.reason = (
                f"time budget (~{need:.0f}s needed; {max(0.0, self.remaining()):.0f}s of the budget left, "
                f"{max(0.0, self.remaining() - max(0.0, left)):.0f}s of it kept for the final check)"
            )
            return row
        self.judged.add((against, plan))
        ref, trial = self._pair(against, plan)
        row.peak_memory_bytes = trial.peak_memory_bytes
        if plan.compile is not False and trial.ok:
            row.compile_s = self.compile_of.get(plan, self._compile_s(trial))
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
        judged = judge(ratios, min_gain=self.min_gain)
        ratio, won = judged.speedup, judged.faster
        if stage == "ablation" and not won and judged.verdict != SLOWER and self._drops_compile(against, plan):
            # Compile stays only where it wins as an addition must: a tie costs its compile on every run for nothing.
            won = True
            row.reason = (
                f"compile bought nothing beyond noise a step ({1 / ratio:.2f}x with it) for its "
                f"{self.compile_of.get(against, 0.0):.1f} s compile"
            )
        won = self._priced(row, plan, against, ratio, won)
        row.speedup = self.speedup_of.get(against, 1.0) * ratio
        if not won:
            if not row.reason:
                shown = " and ".join(f"{r:.2f}x" for r in ratios)
                row.reason = f"not faster ({shown})" if len(ratios) == 1 else f"not faster when re-measured ({shown})"
            return row
        row.status = "accepted"
        row.reason = f"{ratio:.2f}x the plan before" + (f"; {row.reason}" if row.reason else "")
        self.speedup_of[plan] = row.speedup
        return row

    def _priced(self, row: Attempt, plan: Plan, against: Plan, ratio: float, won: bool) -> bool:
        """Compile's one-off cost against what it saves a step: when one side compiles and the other does not,
        says from which step the compile pays and, with a run length, judges the change over that run."""
        compiled, eager = (plan, against) if plan.compile is not False else (against, plan)
        if (compiled.compile is False) or (eager.compile is not False) or compiled not in self.compile_of:
            return won
        cost = self.compile_of[compiled]
        t_eager, t_compiled = self.median(eager), self.median(compiled)
        saving = t_eager - t_compiled
        pays = cost / saving if saving > 0 else float("inf")
        if compiled == plan and plan.replace(compile=against.compile) == against:  # compile alone: its own saving
            row.pays_after_steps = pays
        if self.run_steps is None:
            return won
        run = self.run_steps
        amortised = (t_eager * run) / (t_compiled * run + cost)  # > 1: the compiled run ends first
        said = (
            f"compile costs {cost:.1f} s and saves {saving * 1e3:.2f} ms a step: it pays after {pays:,.0f} steps; "
            f"this run has {run:,}"
            if saving > 0
            else f"compile costs {cost:.1f} s and saves nothing a step"
        )
        if compiled == plan and won and amortised < 1 + self.min_gain:
            row.reason = said
            return False
        if compiled == against and not won and amortised < 1.0:
            row.reason = said  # removing compile wins over this run, though each compiled step is faster
            return True
        return won

    def _can_pair_again(self, need: float) -> bool:
        return need <= self.remaining() - self._estimate(self.base)

    @staticmethod
    def _drops_compile(against: Plan, plan: Plan) -> bool:
        return against.compile is not False and plan == against.replace(compile=False)

    def best_of(self, switch: Switch, current: Plan, stage: str, suffix: str = "") -> Plan:
        """Try each value of ``switch`` on top of ``current``; the fastest accepted one wins."""
        winners = []
        for plan in self._additions(current, [switch]):
            value = getattr(plan, switch.field)
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
        target = min(4.0, max(0.5, (self.given_budget or 120.0) / 60))
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

    def _rules_plan(self) -> Plan:
        picks = {s.field: s.rules_pick for s in self.candidates.timed if s.recommended}
        return self.base.replace(**picks)

    def _size_budget(self, rules: Plan) -> None:
        """With no budget given, one from what the baseline showed: room for the rules' plan, its ablation,
        the additions and the final checks, each trial at the naive plan's cost, plus each compile."""
        per_trial = self._estimate(self.base)
        values = sum(len(s.values) for s in self.candidates.timed)
        trials = 2 * (1 + len(rules.changes(self.base)) + values) * 2 + 6
        compiles = sum(len(s.values) for s in self.candidates.timed if s.expensive)
        wanted = trials * per_trial + compiles * self.compile_guess
        self.budget_s = min(_AUTO_BUDGET_S[1], max(_AUTO_BUDGET_S[0], wanted))
        self.deadline = self.clock() + self.budget_s
        self.notes.append(
            f"budget: {self.budget_s:.0f}s, derived from a {per_trial:.1f}s trial of the naive plan "
            f"({trials} trials{f' and {compiles} compile' + ('s' if compiles > 1 else '') if compiles else ''})"
        )

    def _say_if_short(self, rules: Plan) -> None:
        """A budget that cannot time the rules' plan (a compile, mostly) says so before the search, not after."""
        need = self._estimate(self.base) * 2 + self._estimate(rules)
        if rules.compile is not False and need > self.remaining():
            self.notes.append(
                f"a {self.budget_s:.0f}s budget cannot time the rules' plan with compile (~{need:.0f}s with one "
                f"compile): the rest is timed without it, and compile is kept as the rules pick it, untimed, unless "
                f"it fits later; give time_budget_s={need * 2:.0f} or more to time it"
            )

    def run(self) -> SearchResult:
        self.baseline()
        rules = self._rules_plan()
        if self.given_budget is None:
            self._size_budget(rules)
        current = self.base
        if rules != self.base:
            self.rules = rules
            self._say_if_short(rules)
            if rules.compile is not False and self._estimate(self.base) + self._estimate(rules) > self.remaining():
                self.untimed_compile = rules.compile
                rules = rules.replace(compile=self.base.compile)  # what of the rules fits the budget
                self.rules = rules if rules != self.base else None
        if self.rules is not None:
            row = self.attempt(self.rules, self.base, "rules: " + self.rules.describe(), "rules")
            self.rules_ok = (
                row.status in ("accepted", "rejected")
                and row.samples_per_s > 0
                and not (row.reason.startswith(("numerics", "failed")))
            )
            if row.status == "accepted":
                current = self.rules
                self.accepted.append(current)
                current = self.ablate(current)
        cheap = sorted((s for s in self.candidates.timed if not s.expensive), key=lambda s: not s.recommended)
        expensive = [s for s in self.candidates.timed if s.expensive]
        compiled_before = current.compile is not False
        stages = [(cheap, "switch"), (expensive, "compile")]
        if self._compile_first(current, cheap, expensive):
            stages.reverse()
        for switches, stage in stages:
            for switch in switches:
                current = self.best_of(switch, current, stage)
        self._say_compile_untimed()
        if current.compile is not False and not compiled_before:
            for switch in (s for s in cheap if s.interacts_with_compile):
                plain = getattr(self.base, switch.field)
                if getattr(current, switch.field) != plain:  # kept before compile: try it off again
                    switch = dataclasses.replace(switch, values=(plain,))
                current = self.best_of(switch, current, "under-compile", " (under compile)")
        return self.finish()

    def _additions(self, current: Plan, switches: list[Switch]) -> list[Plan]:
        """The plans to time on top of ``current`` for ``switches``: not a value already in it, nor one a measurement
        took out, nor a pair already timed (the rules' plan is often one switch on top of naive)."""
        plans = [
            current.replace(**{s.field: v})
            for s in switches
            for v in s.values
            if v != getattr(current, s.field) and (s.field, v) not in self.ablated
        ]
        return [plan for plan in plans if (current, plan) not in self.judged]

    def _compile_first(self, current: Plan, cheap: list[Switch], expensive: list[Switch]) -> bool:
        """Whether compile goes before the cheap additions: when the budget left holds compile's pair but not
        that and two pairs of every cheap addition too. Compile is the big win the budget is for; cheap ones
        tried on top of it afterwards compile again, so they come first whenever time allows both."""
        compiles = self._additions(current, expensive) if current.compile is False else []
        if not compiles:
            return False
        held = self._estimate(self.base) + self._estimate(current)
        one = min(self._estimate(current) + self._estimate(p) for p in compiles)
        cheap_pairs = sum(2 * (self._estimate(current) + self._estimate(p)) for p in self._additions(current, cheap))
        left = self.remaining() - held
        return one <= left < one + cheap_pairs

    def _say_compile_untimed(self) -> None:
        """Compile skipped for want of time, said before the table with the budget that would time it."""
        skipped = [
            r for r in self.attempts if r.status == "skipped" and r.plan.compile is not False and r.stage == "compile"
        ]
        if skipped and not self.compile_seen and self.untimed_compile is None:  # (the rules' compile: said before)
            need = self.clock() - self.started + self._estimate(self.base) * 4 + self._estimate(skipped[0].plan)
            why = skipped[0].reason.removeprefix("time budget (")
            self.notes.append(
                f"compile was not timed within the {self.budget_s:.0f}s budget ({why}; "
                f"give time_budget_s={need * 1.25:.0f} or more to time it"
            )

    def ablate(self, current: Plan) -> Plan:
        """Each switch of the rules' plan taken out once, compile first; out for good when that is faster."""
        order = {s.field: (not s.expensive, s.order) for s in self.candidates.timed}
        for field_name in sorted(current.changes(self.base), key=lambda f: order.get(f, (True, 0))):
            without = current.replace(**{field_name: getattr(self.base, field_name)})
            row = self.attempt(without, current, f"without {field_name}={getattr(current, field_name)}", "ablation")
            if row.status == "accepted":
                self.ablated.add((field_name, getattr(current, field_name)))
                current = without
                self.accepted.append(current)
        return current

    def _final_ratio(self, against: Plan, plan: Plan) -> float:
        ratios: list[float] = []
        for _ in range(2):
            if ratios and self._estimate(against) + self._estimate(plan) > self.remaining():
                break
            ratios.append(self._paired_ratio(against, plan))
        return statistics.geometric_mean(ratios) if min(ratios) > 0 else 0.0

    def _not_slower_than_rules(self, plan: Plan, said: list[str]) -> bool:
        """The rules' plan side by side with ``plan``: False (and why, in ``said``) when the rules win beyond noise."""
        if self.rules is None or not self.rules_ok or plan == self.rules:
            return True
        if self._estimate(self.rules) + self._estimate(plan) > self.remaining():
            return True  # no time for the check: the search's own pairs stand
        ratio = self._final_ratio(self.rules, plan)
        if ratio >= 1.0 / (1.0 + self.min_gain):
            return True
        said.append(f"{plan.describe()} measured {ratio:.2f}x the rules' plan side by side")
        return False

    def finish(self) -> SearchResult:
        refused: list[str] = []
        message, speedup, chosen = "", 1.0, self.base
        # Never slower: the chosen plan is timed next to the rules' plan and the naive one once more (twice
        # when time allows). If it loses, the rules' plan and then the plans accepted before it are checked
        # the same way, latest first, so one noisy last step does not throw away the earlier wins; a rules' plan
        # whose own trial was not believed is checked next where it beat the chosen plan side by side.
        order = [p for p in reversed(self.accepted) if p != self.base]
        if self.rules is not None and self.rules_ok and self.rules in order:
            order.remove(self.rules)
            order.insert(1 if order else 0, self.rules)  # the first fallback
        line = list(dict.fromkeys(order))
        for plan in line:  # grows: a plan the rules' plan beat side by side puts the rules' plan in line after it
            if refused and self._estimate(self.base) + self._estimate(plan) > self.remaining():
                break
            if not self._not_slower_than_rules(plan, refused):
                # The rules' plan won that pair though its own noisy trial was not believed: without it in line,
                # naive came back, slower than both.
                if self.rules is not None and self.rules not in line:
                    line.insert(line.index(plan) + 1, self.rules)
                continue
            ratio = self._final_ratio(self.base, plan)
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
            which = " (the rules' plan)" if chosen == self.rules else ""
            message = f"{speedup:.2f}x the naive plan: {chosen.describe()}{which}" + (
                f" ({message})" if message else ""
            )
        chosen_step = self.median(chosen)
        if self.untimed_compile is not None and chosen.compile is False and not self.compile_seen:
            chosen = chosen.replace(compile=self.untimed_compile)
            self.notes.append(
                f"compile={self.untimed_compile!r} is the rules' pick, kept untimed: the budget could not hold a "
                "compile; the speed-up and samples/s are those of the plan without it"
            )
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
                pays_after_steps=self._pays_after(chosen),
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
            notes=self.notes,
            rules=self.rules,
            budget_s=self.budget_s,
        )

    def _pays_after(self, plan: Plan) -> float | None:
        """From which step the chosen plan's compile pays, against the same plan without compile (when timed)."""
        eager = plan.replace(compile=False)
        if plan.compile is False or plan not in self.compile_of or eager not in self.times:
            return None
        saving = self.median(eager) - self.median(plan)
        return self.compile_of[plan] / saving if saving > 0 else float("inf")


def search_plan(
    measure: Measure,
    candidates: Candidates,
    base: Plan | None = None,
    time_budget_s: float | None = 120.0,
    tolerance: float = DEFAULT_TOLERANCE,
    min_gain: float = MIN_GAIN,
    warmup: int = 3,
    device_type: str = "cpu",
    clock: Callable[[], float] = time.monotonic,
    run_steps: int | None = None,
) -> SearchResult:
    """Find the fastest plan that passes the numerics guard, within ``time_budget_s`` seconds (None: a budget
    derived from the naive plan's step time); ``run_steps``: the run's length, over which compile is priced."""
    if run_steps is not None and run_steps < 1:
        raise ValueError(f"run_steps must be a positive number of optimizer steps, got {run_steps}")
    return _Search(
        measure,
        candidates,
        base or Plan(),
        time_budget_s,
        tolerance,
        min_gain,
        warmup,
        device_type,
        clock,
        run_steps,
    ).run()
