"""What-ifs that run a Plan switch or a larger batch on a copy of the captured model and batch
(:func:`turbotrain.measure.run_trial`), interleaved with a baseline that reproduces the script's settings."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import TYPE_CHECKING, Any, Iterator, cast

from ..analysis.replay import repeat_batch
from ...measure import HOPELESS, Trial, judge, time_loader
from ...plan import Plan
from ..findings import Finding
from ..requests import BatchRequest, PlanRequest
from ..results import BatchResult, PlanResult
from .outcome import Judged, Note, Outcome, model_share, not_measured
from .common import Budget, ModelTrials, interleaved_rounds, typical_s
from .fresh import FAULTS_PER_STEP, FreshProcesses, allocator_churn

if TYPE_CHECKING:
    from ..analysis.context import Context


def plan_trials(
    ctx: Context, findings: list[Finding], budget: Budget, allow_compile: bool
) -> Iterator[tuple[Finding, Outcome | None]]:
    """Each Plan switch the findings ask for, timed against the script's settings: each finding's outcome as it
    is timed; None where the budget could not hold its trial."""
    wanted = [f for f in findings if isinstance(f.request, PlanRequest) and (allow_compile or not f.request.compile)]
    if not wanted or ctx.capture is None:
        return
    eager = None  # a compiled model's eager original, which its optimizer switches are timed on
    if ctx.facts.compiled:  # the module itself where a compiled function (Lightning's training_step) calls it
        eager = getattr(ctx.capture.module, "_orig_mod", ctx.capture.module)
        for f in wanted:
            if not set(_plan_trial(f).changes) <= _TIMED_EAGER:
                yield f, Outcome(before=(not_measured(_INSIDE_THE_GRAPH),))
        wanted = [f for f in wanted if set(_plan_trial(f).changes) <= _TIMED_EAGER]
        if not wanted or eager is None:
            return
    trials = ModelTrials(ctx, budget, model=eager)
    first = trials.baseline()
    if first is None:  # the budget refused it: each finding says so with the budget that gives it room
        for f in wanted:
            budget.allows(trials.cost)  # the refusal, recorded again for this finding
            yield f, None
        return
    if not first.ok:
        for f in wanted:
            yield f, Outcome(before=(not_measured(first.error or ""),))
        return
    # The script's setting's fresh process serves every switch compared with it, and ends with the loop.
    with FreshProcesses(ctx, trials, budget) as fresh_processes:
        for f in sorted(wanted, key=lambda f: _plan_trial(f).compile):
            changes = dict(_plan_trial(f).changes)
            base = trials.base_plan.replace(**_plan_trial(f).baseline)
            plan = base.replace(**changes)
            compiling = bool(changes.get("compile"))
            cost = trials.cost * (8 if compiling else 2)
            if not budget.allows(cost):
                yield f, None  # said with the budget that gives it room (whatif._say_untimed)
                continue
            seen: dict[str, Any] = {}

            def pair(base=base, plan=plan, compiling=compiling, seen=seen) -> tuple[float, float] | None:
                """One round: the baseline, then the candidate right after it (the same machine load)."""
                ref = trials.trial(base)
                if not ref.ok:
                    return None
                trial = trials.trial(
                    plan, warmup=3 if compiling else None, give_up_s=None if compiling else HOPELESS * typical_s(ref)
                )
                seen.setdefault("first", trial)
                seen["ref"], seen["last"] = ref, trial
                if not trial.ok:
                    return None
                return typical_s(ref), typical_s(trial)

            first_round = pair()
            trial = seen.get("first")
            entries = {_entry_for_field(k) for k in changes}
            skipped = [name for name, _ in trial.skipped if name in entries] if trial is not None else []
            if trial is None or skipped or (first_round is None and not trial.stopped_early):
                why = (trial.error if trial is not None else None) or "; ".join(
                    w for _, w in (trial.skipped if trial else [])
                )
                yield f, Outcome(before=(not_measured(why or "the baseline failed"),))
                continue
            if trial.stopped_early:
                ratios = [1.0 / HOPELESS]  # slower than HOPELESS times the baseline: no need for more rounds
            else:
                assert first_round is not None  # only a trial that stopped early has none here
                # Compile: one round (the graph compiles once per trial).
                exact = all(_exact(k) for k in changes)
                ratios = (
                    [first_round[0] / first_round[1]]
                    if compiling
                    else interleaved_rounds(ctx, budget, trials.cost * 2, first_round, pair, confirm_gain=not exact)
                )
            result = PlanResult(
                changes=changes, steps=trials.steps, losses_finite=all(map(math.isfinite, trial.losses))
            )
            notes: tuple[Note, ...] = ()
            warm_only = False  # timed only in the doctor's warm process, where an allocator-bound gain reads high
            churn = allocator_churn(seen.get("ref"), seen.get("last"))
            if churn >= FAULTS_PER_STEP and not compiling and not trial.stopped_early:
                ratios, result, where = _fresh_or_in_process(fresh_processes, base, plan, ratios, churn, result)
                notes, warm_only = (where,), result.timed_in == "this process"
            result = dataclasses.replace(
                result,
                rounds=tuple(round(r, 3) for r in ratios),
                candidate_ms=round(typical_s(trial) * 1e3, 3) if trial.ok else None,
                compile_s=round(trial.warmup_s, 2) if compiling else None,
            )
            if compiling:
                notes = (Note(f"Compiling took {trial.warmup_s:.1f} s (once per run)."),)
            if eager is not None:
                notes = (*notes, _ON_THE_EAGER_ORIGINAL if set(changes) <= OUTSIDE_THE_GRAPH else _SHOWN_EAGER)
            yield f, Outcome(Judged(result, judge(ratios, noise_floor=ctx.noise_floor)), before=notes, low=warm_only)


# The switches that change the optimizer's step, which runs outside torch.compile's graph: a compiled model's are
# timed on its eager original. Any other changes what the graph computes: timing it would compile both ways.
OUTSIDE_THE_GRAPH = frozenset({"fused_optimizer", "set_to_none"})
# ... except precision, whose gain is mostly the matmuls', which the eager original runs as the graph does: timed
# there too, and said to be an eager figure (the graph fuses the casts around them).
SHOWN_EAGER = frozenset({"precision"})
_TIMED_EAGER = OUTSIDE_THE_GRAPH | SHOWN_EAGER
_INSIDE_THE_GRAPH = (
    "the script compiles its model and this switch changes what the compiled graph computes; the what-ifs "
    "time such a switch on eager models only"
)
_ON_THE_EAGER_ORIGINAL = Note(
    "Timed on the model's eager original (the optimizer steps outside torch.compile's graph): the ratio is over "
    "an eager step, longer than the compiled one, so the gain credited here is, if anything, low.",
    at="before",
)


_SHOWN_EAGER = Note(
    "Timed on the model's eager original (compiling it both ways would take two fresh compiles): the compiled "
    "graph fuses the casts and the elementwise work around the matmuls, so its gain can differ; --fix --verify "
    "times the compiled script itself.",
    at="before",
)


def _plan_trial(f: Finding) -> PlanRequest:
    """The finding's trial, of the findings plan_trials kept (all PlanRequest)."""
    return cast(PlanRequest, f.request)


def _fresh_or_in_process(
    fresh_processes: FreshProcesses,
    base: Plan,
    plan: Plan,
    ratios: list[float],
    churn: float,
    result: PlanResult,
) -> tuple[list[float], PlanResult, Note]:
    """The switch re-timed in fresh processes (:meth:`FreshProcesses.rounds`): the rounds judged from then on,
    ``result`` saying where they were timed, and the note that says it."""
    fresh = fresh_processes.rounds(base, plan)
    if isinstance(fresh, str):
        note = Note(
            f"Timed in the doctor's process, whose steps page-faulted {churn:.0f} pages each: a training "
            f"process's allocator may differ, and such a gain reads high there, so it is rated low (a fresh-process "
            f"trial failed: {fresh}; a larger --what-if-budget times it in fresh processes).",
            at="before",
        )
        return ratios, dataclasses.replace(result, page_faults_per_step=round(churn), timed_in="this process"), note
    note = Note(
        f"Timed with your setting and the switch each in a fresh process: in the doctor's process the steps "
        f"page-faulted {churn:.0f} pages each, so its allocator's history was part of the time (it read "
        f"x{statistics.median(ratios):.2f} there).",
        at="before",
    )
    return (
        fresh,
        dataclasses.replace(
            result,
            page_faults_per_step=round(churn),
            timed_in="fresh processes",
            in_process_rounds=tuple(round(r, 3) for r in ratios),
        ),
        note,
    )


def _exact(field: str) -> bool:
    """Whether the switch of Plan ``field`` computes the same numbers (speedups' ``exact``); unknown: False."""
    from ...speedups.registry import by_field

    try:
        return by_field(field).exact
    except KeyError:
        return False


def _entry_for_field(field: str) -> str:
    from ...speedups.registry import by_field

    try:
        return by_field(field).name
    except KeyError:
        return field


def batch_trial(ctx: Context, finding: Finding, budget: Budget) -> Outcome | None:
    if ctx.capture is None or ctx.facts.compiled:
        return None
    batch = ctx.capture.batch_size
    assert isinstance(finding.request, BatchRequest)
    k = finding.request.factor
    trials = ModelTrials(ctx, budget)
    if not budget.allows(trials.cost * 3):
        return None
    bigger = [repeat_batch(ctx.capture, k)]
    seen: dict[str, Trial] = {}

    def pair() -> tuple[float, float] | None:
        """One round: the captured batch, then k times it; seconds per sample of each."""
        base = trials.trial(trials.base_plan)
        big = trials.trial(trials.base_plan, batches=bigger)
        if ctx.capture is not None and ctx.capture.unbatched:
            base.samples_per_step = 1  # one sample whose dim 0 is its features, not a batch
        seen["base"], seen["big"] = base, big
        if not (base.ok and big.ok):
            return None
        return typical_s(base) / base.samples_per_step, typical_s(big) / big.samples_per_step

    first = pair()
    if first is None:
        why = not_measured(seen["base"].error or seen["big"].error or "")
        if seen["base"].ok:
            # The model trains on its own batch and not on k of them: the dimension read as the batch is not one.
            cap = Note(f"Dimension 0 of the batch ({batch}) could not be made {k}x larger.", at="after")
            return Outcome(before=(why,), low=True, after=(cap,))
        return Outcome(before=(why,))
    model_rounds = interleaved_rounds(ctx, budget, trials.cost * 3, first, pair)
    base, big = seen["base"], seen["big"]
    loader_ratio, loader_note = loader_samples_ratio(ctx, batch, k, budget)
    # The step's model part goes k-fold wider at the ratio just timed; its loading part at the loader's own.
    model, data = model_share(ctx), ctx.share("data_loading")
    ratios = [(model + data) / (model / r + data / loader_ratio) for r in model_rounds if r > 0]
    result = BatchResult(
        batch_size=batch,
        candidate_batch_size=batch * k,
        rounds=tuple(round(r, 3) for r in ratios),
        model_rounds=tuple(round(r, 3) for r in model_rounds),
        loader_samples_ratio=round(loader_ratio, 3),
        loader=loader_note,
        baseline_samples_per_s=round(base.samples_per_step / typical_s(base), 1),
        candidate_samples_per_s=round(big.samples_per_step / typical_s(big), 1),
    )
    verdict = judge(ratios, noise_floor=ctx.noise_floor)
    return Outcome(
        Judged(result, verdict, applies_to=min(1.0, model + data), unit="model's samples/s"),
        fix=dataclasses.replace(finding.fix, plan={"batch_size": batch * k}),
    )


def loader_samples_ratio(ctx: Context, batch: int, k: int, budget: Budget) -> tuple[float, str]:
    """How much faster per sample the script's DataLoader delivers at ``k * batch`` than at ``batch``, and how
    that was found. A batch's fetching costs per sample (``__getitem__``, transforms), its collating and the
    iterator per batch: only the second part spreads over a larger batch, so the loader is timed at both
    sizes, alternately, the faster of two timings each. Where it cannot be, the loading is taken to cost per
    sample (ratio 1): a larger batch is never credited with loading it has not been seen to save."""
    from torch.utils.data import DataLoader

    record, data_s = ctx.main_loader, ctx.seconds("data_loading")
    if data_s <= 0:
        return 1.0, "no time waiting on data"
    if record is None or not isinstance(record.loader, DataLoader):
        return 1.0, "not timed (no DataLoader): loading taken to cost per sample"
    if record.loader.batch_size != batch:
        return 1.0, (
            f"not timed (the DataLoader's batch_size is {record.loader.batch_size}, the model saw {batch}): "
            "loading taken to cost per sample"
        )
    batches = int(min(30, max(4, 0.2 / data_s)))
    start_s = 1.0 if record.settings.get("num_workers") else 0.0  # worker processes start with each timing
    if not budget.allows(2 * (start_s + (batches + 2) * data_s * (1 + k))):
        return 1.0, "not timed (the what-if time budget is spent): loading taken to cost per sample"
    rates = {batch: 0.0, batch * k: 0.0}
    try:
        for _ in range(2):
            for size in rates:
                rates[size] = max(rates[size], time_loader(record.loader, batches=batches, batch_size=size))
    except Exception as exc:  # noqa: BLE001 - a loader that cannot be rebuilt at another batch size
        return 1.0, f"not timed ({type(exc).__name__}: {exc}): loading taken to cost per sample"
    if min(rates.values()) <= 0:
        return 1.0, "not timed (the loader yielded no batch): loading taken to cost per sample"
    return k * rates[batch * k] / rates[batch], f"timed at batch_size {batch} and {batch * k}"
