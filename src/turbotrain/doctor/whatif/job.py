"""Fixes timed on every rank of a multi-process job, in lockstep: the user's launcher run again, alternately
as it is and with the fix applied on every rank (:class:`~..rank_change.RankChange`).

One round is a run of the job as it is followed by a run with each fix; the ratio of a round is the job's step
time without the fix over with it. The job's step time is its slowest rank's median step: in data-parallel
training every rank ends each step at the same all-reduce, so the job goes as fast as its slowest rank. A fix
that makes work rarer (a save, an evaluation every few steps) compares the job's mean step instead: its steps
differ one from the next.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ...measure import FASTER, MIN_GAIN, SLOWER, judge
from ..analysis.ranks import analyse_ranks, measured_steps
from ..job.launcher import JobRun, run_job
from ..rank_change import RankChange
from ..apply.change import observed
from ..requests import JobRequest
from ..results import JobResult
from .outcome import Judged, Note, Outcome, attach

if TYPE_CHECKING:
    from ..findings import Finding
    from ..record.recording import Recording

__all__ = ["JobTiming", "time_on_the_job", "job_step_s", "job_steps_ms", "job_runner", "timed_steps"]

ROUNDS = 2  # the least that judge() calls (both rounds must agree); a third where the budget has room
MAX_ROUNDS = 3
DISPUTED_ROUNDS = 2  # more for a fix whose rounds disagree, where --job-what-if-rounds allows MAX_ROUNDS
STEPS, WARMUP = 12, 3  # per timed run, at the least: enough steps for a median; no profiler window
# The least time a timed run's measured steps span, and the most steps that takes: 12 steps of 10 ms are one
# eighth of a second, which one burst of other work on the machine can make look faster or slower.
TRIAL_S, MAX_STEPS = 0.5, 100


def timed_steps(step_s: float) -> int:
    """Steps each timed run measures, for a job whose step takes ``step_s``."""
    return int(min(MAX_STEPS, max(STEPS, math.ceil(TRIAL_S / step_s)))) if step_s > 0 else STEPS


def _every_rank(job: JobRun) -> list[Recording]:
    """Every rank's recording; none when the job failed or a rank sent nothing."""
    recordings = job.recordings
    return recordings if job.failure is None and recordings and len(recordings) == len(job.ranks) else []


def job_step_s(job: JobRun) -> float | None:
    """The job's step time: its slowest rank's median measured step (None when a rank sent nothing)."""
    recordings = _every_rank(job)
    if not recordings:
        return None
    analysis = analyse_ranks(recordings)
    if analysis is None:
        return None
    return max(r.step_s for r in analysis.ranks)


def _job_time(job: JobRun, change: RankChange) -> float | None:
    """The job's step time to compare for ``change``: its mean step where the change makes work rarer (work every
    other step leaves a median that is one kind of step or the other), else :func:`job_step_s`."""
    if not change.changes_cadence:
        return job_step_s(job)
    steps = job_steps_ms(job)
    return statistics.fmean(steps) / 1e3 if steps else None


def job_steps_ms(job: JobRun) -> list[float]:
    """Each measured step of the job, in ms: the slowest rank's, step by step (every rank's step ends at the
    same all-reduce). Empty when a rank sent nothing."""
    per_rank = [measured_steps(r) for r in _every_rank(job)]
    if not per_rank:
        return []
    common = sorted(set.intersection(*(set(steps) for steps in per_rank)))
    return [max(steps[i].duration for steps in per_rank) * 1e3 for i in common]


@dataclass
class JobTiming:
    """How to run the job once (``run(change)``) and how long a run takes, for the budget."""

    run: Callable[[RankChange | None], JobRun]
    run_s: float  # seconds one run of the job took (the doctor's own run)
    budget_s: float
    noise_floor: float = 0.0
    max_rounds: int = MAX_ROUNDS  # rounds beyond ROUNDS only where the budget has room


def time_on_the_job(timing: JobTiming, findings: list[Finding], rules: tuple[str, ...] | None = None) -> None:
    """Measure what each finding's :class:`JobRequest` buys on the whole job (of ``rules``' findings, when given),
    and attach it (:func:`.outcome.attach`)."""
    for f, outcome in _timed_on_the_job(timing, findings, rules):
        attach(f, None, outcome)


def _timed_on_the_job(
    timing: JobTiming, findings: list[Finding], rules: tuple[str, ...] | None
) -> Iterator[tuple[Finding, Outcome]]:
    asked = [f for f in findings if isinstance(f.request, JobRequest)]
    if rules is not None:
        for f in asked:
            if f.rule not in rules:
                left_out = f"Not timed on the job: --job-what-if-rules {','.join(rules)} leaves {f.rule} out."
                yield f, Outcome(before=(Note(left_out),))
        asked = [f for f in asked if f.rule in rules]
    if not asked:
        return
    started = time.monotonic()
    # As many fixes as the budget times in ROUNDS rounds, in the order the rules rated them.
    fits = int(timing.budget_s / (ROUNDS * max(timing.run_s, 1e-3))) - 1
    no_room = (
        f"Not timed: one run of the job takes about {timing.run_s:.0f} s, and the job what-if budget "
        f"({timing.budget_s:.0f} s, --job-what-if-budget) has no room for {ROUNDS} more with this fix."
    )
    for f in asked[max(fits, 0) :]:
        yield f, Outcome(before=(Note(no_room),))
    asked = asked[: max(fits, 0)]
    if not asked:
        return
    times: dict[int, list[tuple[float, float]]] = {id(f): [] for f in asked}
    seen: dict[int, dict[str, Any]] = {}
    failed: dict[int, str] = {}
    rounds = max(ROUNDS, timing.max_rounds)
    extra = DISPUTED_ROUNDS if timing.max_rounds >= MAX_ROUNDS else 0
    for done in range(rounds + extra):
        timed = [
            f for f in asked if id(f) not in failed and (done < rounds or _disputed(times[id(f)], timing.noise_floor))
        ]
        spent = time.monotonic() - started
        if not timed or (done >= ROUNDS and spent + timing.run_s * (1 + len(timed)) > timing.budget_s):
            break
        as_it_is = timing.run(None)
        if job_step_s(as_it_is) is None:
            break  # the job as it is did not run again: nothing to compare with
        for f in timed:
            request = f.request
            assert isinstance(request, JobRequest)  # filtered above
            run = timing.run(request.change)
            step = _job_time(run, request.change)
            if step is None:
                failed[id(f)] = run.failure or "a rank sent no recording"
                continue
            base = _job_time(as_it_is, request.change)
            if base is not None:
                times[id(f)].append((base, step))
            seen[id(f)] = observed(run.recordings, [r.run.get("applied", {}) for r in run.ranks if r.run])
    for f in asked:
        yield f, _conclude(f, times[id(f)], seen.get(id(f), {}), failed.get(id(f)), timing.noise_floor)


def _disputed(pairs: list[tuple[float, float]], noise: float) -> bool:
    """Rounds that disagree: the judge calls a gain while a round saw none, or a loss while a round saw a gain.
    On a noisy machine one launch of a job can run 20% faster than the next, fix or no fix."""
    ratios = [base / step for base, step in pairs]
    if len(ratios) < ROUNDS:
        return False
    verdict = judge(ratios, noise_floor=noise).verdict
    return (verdict == FASTER and min(ratios) < 1 + MIN_GAIN) or (verdict == SLOWER and max(ratios) > 1 + MIN_GAIN)


def _conclude(
    finding: Finding, pairs: list[tuple[float, float]], seen: dict[str, Any], failure: str | None, noise: float
) -> Outcome:
    request = finding.request
    assert isinstance(request, JobRequest)
    if failure is not None:
        failed = f"Timed on every rank, the job failed with the fix ({request.change.describe()}): {failure}"
        return Outcome(before=(Note(failed),), low=True)
    if len(pairs) < ROUNDS:
        return Outcome(before=(Note("Not timed: the job did not run again as it was."),))
    ratios = [base / step for base, step in pairs]
    result = JobResult(
        change=request.change.describe(),
        ranks=int(seen.get("ranks", 0)),
        rounds=tuple(round(r, 3) for r in ratios),
        baseline_ms=round(statistics.median(b for b, _ in pairs) * 1e3, 3),
        candidate_ms=round(statistics.median(s for _, s in pairs) * 1e3, 3),
        observed=seen,
    )
    # The ratio is of the whole job's step: all of the step is what it applies to.
    verdict = judge(ratios, noise_floor=noise)
    timed = f"Timed on all {result.ranks} ranks, {len(pairs)} rounds of the job with and without the fix."
    return Outcome(
        Judged(result, verdict, applies_to=1.0, unit="whole job's step time"), after=(Note(timed, at="before"),)
    )


def job_runner(command: list[str], hang_timeout_s: float, steps: int = STEPS) -> Callable[[RankChange | None], JobRun]:
    """``run(change)``: the user's launcher once, every rank recorded over ``steps`` steps, ``change`` applied on
    every rank."""

    def run(change: RankChange | None) -> JobRun:
        return run_job(
            command, steps=steps, warmup=WARMUP, profile=0, hang_timeout_s=hang_timeout_s, change=change, warm=True
        )

    return run
