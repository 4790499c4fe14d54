"""What-ifs of process settings: intra-op threads and DataLoader workers, timed on the user's model
training beside its own loader (workers compete for the cores as they do in the script)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

import torch

from ...measure import Trial, judge, run_trial, time_loader
from ..findings import Finding
from ..requests import ThreadsRequest
from ..results import LoaderResult, ThreadSetting, ThreadsResult
from ..rules.data.num_workers import no_faster_count_fix, workers_fix
from ..rules.machine.cpu_oversubscribed import ThreadsEvidence, threads_fix
from .outcome import Judged, Note, Outcome, Projected, model_share, not_measured
from .common import Budget, ModelTrials, interleaved_rounds, surrogate_step

if TYPE_CHECKING:
    from ..analysis.context import Context


def setting_rounds(
    ctx: Context, budget: Budget, now: tuple[int, int], options: list[tuple[int, int]]
) -> tuple[tuple[int, int], list[float], dict[str, Trial]] | str:
    """:func:`_timed_settings` without torch's "more workers than cores" advice (the trial means it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return _timed_settings(ctx, budget, now, options)


def _timed_settings(
    ctx: Context, budget: Budget, now: tuple[int, int], options: list[tuple[int, int]]
) -> tuple[tuple[int, int], list[float], dict[str, Trial]] | str:
    """(intra-op threads, DataLoader workers) settings timed against the script's own ``now`` on a copy of its
    model, each step also pulling a batch from its own loader (so workers compete for the cores as they do
    in the script), A/B interleaved: the best option, its per-round ratios and the last trials; or why not.
    Medians, not fastest steps: contention slows every step."""
    from ...data.loader import rebuild_loader

    trials = ModelTrials(ctx, budget)
    record = ctx.main_loader
    streams: dict[int, Any] = {}

    def pull(workers: int) -> None:
        if record is None:
            return
        if workers not in streams:
            streams[workers] = iter(rebuild_loader(record.loader, num_workers=workers))
        try:
            next(streams[workers])
        except StopIteration:
            streams[workers] = iter(rebuild_loader(record.loader, num_workers=workers))
            next(streams[workers])

    def timed(threads: int, workers: int) -> Trial:
        def step(model, batch):
            pull(workers)  # the loader's work is part of the step, as in the script
            return surrogate_step(model, batch)

        # Each trial starts its own loader and ends it: workers left alive between trials would go on filling
        # their queues during the other setting's trial, timing the script's setting under their load (the
        # fix then reads faster than it is). The warm-up covers the workers' start and then drains the batches
        # they queued meanwhile (workers x prefetch_factor): timed on a full queue, workers read faster than they are.
        buffered = workers * (getattr(record.loader, "prefetch_factor", None) or 2) if record is not None else 0
        streams.pop(workers, None)
        try:
            trial = run_trial(
                trials.model,
                trials.optimizer_fn,
                None,
                trials.batches,
                trials.base_plan.replace(intra_op_threads=threads),
                steps=max(trials.steps, 2 * buffered, 3 * workers),
                warmup=trials.warmup + workers + buffered,
                step_fn=step,
            )
            trial.loader_round = workers
            return trial
        finally:
            streams.pop(workers, None)  # its worker processes end with the iterator

    seen: dict[str, Trial] = {}

    def pair(fix: tuple[int, int]) -> tuple[float, float] | None:
        a, b = timed(*now), timed(*fix)
        seen["now"], seen["fix"] = a, b
        return (a.step_s, b.step_s) if a.ok and b.ok else None

    try:
        if not budget.allows(trials.cost * (1 + len(options)) + 2.0):
            return "the what-if time budget is spent"
        # Round one times every option next to the script's setting; the best goes on to more rounds.
        firsts = {fix: pair(fix) for fix in options}
        timed_ok = {fix: t for fix, t in firsts.items() if t is not None}
        if not timed_ok:
            return seen["now"].error or seen["fix"].error or "the trials failed"
        fix = max(timed_ok, key=lambda c: timed_ok[c][0] / timed_ok[c][1])
        return fix, interleaved_rounds(ctx, budget, trials.cost * 2, timed_ok[fix], lambda: pair(fix)), seen
    finally:
        streams.clear()  # worker processes end with their iterators


def _threads_now(ctx: Context) -> int:
    """The script's intra-op threads as the run saw them (torch's count now where the machine is not known)."""
    return (ctx.machine.intra_op_threads if ctx.machine is not None else None) or torch.get_num_threads()


def threads_trial(ctx: Context, finding: Finding, budget: Budget) -> Outcome | None:
    """The script's threads and workers against the recommended settings (:func:`setting_rounds`), the fix said
    with the measured setting: the exact line and environment variable, in every framework's way."""
    request = finding.request
    assert isinstance(request, ThreadsRequest)  # run_what_ifs passes only these
    if ctx.capture is None or not request.candidates:
        return None
    evidence = finding.evidence_as(ThreadsEvidence)
    now = (_threads_now(ctx), evidence.workers)
    options = list(request.candidates)
    got = setting_rounds(ctx, budget, now, options)
    if isinstance(got, str):
        return Outcome(before=(not_measured(got, at="replace"),))
    fix, ratios, seen = got
    threads, workers = fix
    result = ThreadsResult(
        now=ThreadSetting(*now),
        tried=tuple(options),
        candidate=ThreadSetting(*fix),
        rounds=tuple(round(r, 3) for r in ratios),
        baseline_ms=round(seen["now"].step_s * 1e3, 3),
        candidate_ms=round(seen["fix"].step_s * 1e3, 3),
    )
    return Outcome(
        Judged(result, judge(ratios, noise_floor=ctx.noise_floor), applies_to=threads_apply_to(ctx)),
        fix=threads_fix(threads, now[1], workers, now[0]),
        evidence=dataclasses.replace(evidence, recommended_threads=threads, recommended_workers=workers),
    )


def threads_apply_to(ctx: Context) -> float:
    """The share of the step a thread count changes: the model's step and the loading, and the evaluation forwards
    between steps (the same model's forward: on a busy machine they wait for cores as the training step does)."""
    wanted = set(ctx.measured_steps)
    steps = [s for s in (ctx.recording.steps if ctx.recording is not None else ()) if s.index in wanted]
    total = sum(s.duration for s in steps)
    evaluating = sum(s.phases.get("eval", 0.0) + s.phases.get("eval_grad", 0.0) for s in steps)
    return min(1.0, model_share(ctx) + ctx.share("data_loading") + (evaluating / total if total > 0 else 0.0))


def loader_trial(ctx: Context, finding: Finding, budget: Budget) -> Outcome | None:
    record = ctx.main_loader
    if record is None:
        return None
    loader = record.loader
    current = record.settings["num_workers"]
    data_s = max(ctx.seconds("data_loading"), 1e-6)
    step = ctx.step_s
    other = max(step - data_s, 0.0)
    batches = int(min(30, max(4, 1.0 / data_s)))
    rates: dict[int, float] = {}
    failed: str | None = None
    # The run itself timed the current setting; re-time it here too so every count is measured alike.
    limit = max(2, min(8, 2 * ctx.hw.cpu_cores))
    candidates = sorted({current, 0, 1, 2, 3, 4, 6, 8} - {w for w in (6, 8) if w > limit})
    best, best_rate, worse = current, 0.0, 0
    for workers in candidates:
        if workers > limit or not budget.allows((batches + 2) * data_s / max(1, workers) + 1.0):
            break
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch's "more workers than cores" advice
                # each worker's first batch comes at once, after the start: warm-up takes them all
                rate = time_loader(loader, batches=batches, warmup=2 + workers, num_workers=workers)
        except Exception as exc:  # noqa: BLE001 - a dataset that cannot go to workers (unpicklable, ...)
            failed = f"num_workers={workers} failed: {type(exc).__name__}: {exc}"
            break
        rates[workers] = rate
        if rate > best_rate * 1.10:
            best, best_rate, worse = workers, rate, 0
        else:
            worse += 1
            if worse >= 2 and workers > current:
                break  # stopped improving
    if not rates or best_rate <= 0:
        return Outcome(before=(Note(failed),)) if failed else None

    def projected(workers: int) -> float:
        rate = rates[workers]
        return max(other, 1.0 / rate) if workers > 0 else other + 1.0 / rate

    # Both ends from this trial's own timings: the current setting re-timed, against the best.
    now = projected(current) if current in rates else step
    share = max(0.0, 1.0 - projected(best) / now) if now else 0.0
    result = LoaderResult(
        batches_per_s={k: round(v, 2) for k, v in rates.items()},
        best_num_workers=best,
        projected_step_ms=round(projected(best) * 1e3, 3),
        current_projected_step_ms=round(now * 1e3, 3),
        step_ms=round(step * 1e3, 3),
        pair_ratio=round(now / projected(best), 3) if projected(best) > 0 else 1.0,
        pair_rounds=1,
    )  # one timing each
    fix = workers_fix(best) if best != current else no_faster_count_fix(current, rates) if len(rates) > 1 else None
    if best != current and ctx.capture is not None:
        verified = _verify_workers(ctx, budget, current, best, result)
        if verified is not None:
            # Said before the verdict: where the rounds show no gain, the note opens with why.
            return Outcome(verified, fix=fix, before=(Note(_VERIFIED.format(best=best)),))
    how = (
        f"Loader rates measured for num_workers {', '.join(map(str, rates))}; the step is projected as "
        "max(the rest of the step, one batch's loading time). Workers share the CPU with training."
    )
    return Outcome(Projected(result, share), fix=fix, after=(Note(how),))


_VERIFIED = (
    "num_workers={best} had the best loader rate alone; timed with your model training beside the "
    "loader (workers share the cores with training), interleaved with your setting."
)


def _verify_workers(ctx: Context, budget: Budget, current: int, best: int, projected: LoaderResult) -> Judged | None:
    """The projection leaves out that workers take cores from training: time the model training beside the
    loader, with the script's workers and with ``best``, interleaved (:func:`setting_rounds`); None where it could
    not be (the projection stands)."""
    threads = _threads_now(ctx)
    got = setting_rounds(ctx, budget, (threads, current), [(threads, best)])
    if isinstance(got, str):
        return None
    _, ratios, seen = got
    what_if = dataclasses.replace(
        projected,
        rounds=tuple(round(r, 3) for r in ratios),
        baseline_ms=round(seen["now"].step_s * 1e3, 3),
        candidate_ms=round(seen["fix"].step_s * 1e3, 3),
    )
    applies = min(1.0, model_share(ctx) + ctx.share("data_loading"))
    return Judged(what_if, judge(ratios, noise_floor=ctx.noise_floor), applies_to=applies)
