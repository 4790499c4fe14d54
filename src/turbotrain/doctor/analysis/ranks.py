"""Every rank of a multi-process job side by side: whom the others wait for, why, and what it costs.

Per rank and measured step, the step's time per category (:meth:`StepRecord.categories`) with its *exposed
communication* taken out of compute: the time the step waited for the gradient all-reduce after the rank's own
backward compute was done (:mod:`..record.collectives`), or, under FSDP, in its blocking all-gathers and
reduce-scatters (:mod:`..record.blocking_collectives`). In a data-parallel step every rank ends at the same
all-reduce, so the rank the others wait for is the one that waits least; what it spends more time on than
the others (its data, its compute, work only it does) is the cause. Its cost is read from the others' waiting:
per step, the least any other rank waited beyond the straggler's own wait is the time every step would lose
if the straggler ran like the others (the next rank in line would then be the last to arrive). A straggler that
compiled in the measured steps where the others did not, or runs eagerly after torch.compile's recompile limit
while they run compiled, is late from its recompiles (:mod:`.rank_compile`); so is one late only in the steps it
recompiles, and ranks late in turns, each in the steps it recompiles, have that cause too.

Ranks are lined up on the completion of each step's last all-reduce (the same instant on every rank), never on
host clocks, so the offsets hold across nodes. On that common clock each rank's *lane* is its measured steps, each
with its interval and its seconds per category, for the report's picture of the ranks side by side.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Literal, Mapping, Sequence, Union

from ..findings import LateCause
from ..record.measurements import CATEGORIES, Category, StepRecord
from ..record.recording import Recording
from ..sites import Site
from .rank_compile import RankCompile, compile_explains, rank_compile

__all__ = [
    "RankSummary",
    "Straggler",
    "Imbalance",
    "LaneStep",
    "RankAnalysis",
    "analyse_ranks",
    "measured_steps",
    "oversubscribed",
    "RANK_CATEGORIES",
    "RankCategory",
    "STRAGGLER_SHARE",
    "WAITED_ON",
]

# The breakdown's categories as recorded (python overhead is a model of the whole run, not of a rank's step) plus
# the exposed communication, in the order a rank's row shows them.
RankCategory = Union[Category, Literal["communication"]]
RANK_CATEGORIES: tuple[RankCategory, ...] = (*(c for c in CATEGORIES if c != "python_overhead"), "communication")
# What a rank's exposed communication waits on, by the kind of its steps' records (record/collectives.py).
WAITED_ON = {
    "ddp": "the gradient all-reduce",
    "fsdp": "FSDP's all-gathers and reduce-scatters",
    "collectives": "the script's blocking collectives",
}
# A straggler is named when the others' wait for it is at least this share of the step (a finding's "medium").
STRAGGLER_SHARE = 0.05
# ... when it arrived last in at least this share of the measured steps, and when the others' wait for it
# stands out of its own step-to-step spread (median absolute deviation) by this factor: on a balanced job the
# wait is noise around zero.
CONSISTENT = 0.75
ABOVE_SPREAD = 1.5
# A step's wait within this many spreads of the cost is the cost seen through noise (3 spreads: about 2 sigma).
NOISE_SPREADS = 3.0
# Ranks late in turns are named when the first rank's mean wait for the last is at least this share of the step.
IMBALANCE_SHARE = 0.10
# Causes that are the thread's own CPU work on a CPU run (data loading and work between steps may wait on I/O).
CPU_BOUND: tuple[LateCause, ...] = ("compute", "optimizer", "host_sync", "unexplained")


@dataclass(frozen=True)
class RankSummary:
    rank: int
    host: str
    steps: int  # measured steps
    step_s: float  # median step time
    step_p90_s: float
    median_s: dict[RankCategory, float]  # per category (RANK_CATEGORIES): median seconds per step
    p90_s: dict[RankCategory, float]
    mean_s: dict[RankCategory, float]  # per category: mean seconds per step (they add up to the mean step)
    exposed_s: float  # median exposed communication per step
    busy_s: float  # median of (step - exposed communication): its own work
    timed_sync: bool  # gradient all-reduces were timed on this rank
    cpu_s: float | None = None  # median CPU seconds of its thread per step (None: not known)
    cpu_wait_s: float | None = None  # median seconds per step its thread waited for a CPU others held
    reducer: dict[str, float] = field(default_factory=dict)  # DDP's own reducer statistics (seconds)
    comm_busy_s: float | None = None  # median seconds per step the gradient all-reduces were in flight (timed)
    collectives: float | None = None  # median collectives per step (DDP's buckets, FSDP's gathers and scatters)
    compile: RankCompile | None = None  # what torch.compile compiled in its measured steps (None: it compiled none)

    def reducer_check(self) -> tuple[float, float, float] | None:
        """(DDP's own backward communication time, the doctor's timed all-reduce time, their ratio) per step,
        where both exist: the reducer's averages checked against the wall clock."""
        ddp = self.reducer.get("avg_backward_comm_time")
        if not ddp or not self.comm_busy_s:
            return None
        return ddp, self.comm_busy_s, ddp / self.comm_busy_s


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    # a category of RANK_CATEGORIES but communication, "cpu_contention", "recompile" or "unexplained"
    cause: LateCause
    cost_s: float  # per step: what every step loses waiting for it
    cost_share: float  # of the median step
    compared_with: int  # the median rank it is compared with
    gap_s: dict[Category, float]  # per category: its median minus the median rank's
    last_share: float  # share of measured steps it arrived last in
    site: Site | None = None  # a line that explains the cause, when one is known
    contention_s: float | None = None  # its extra wait for a CPU others held, against the median rank
    cpu_gap_s: float | None = None  # its extra CPU time, against the median rank
    periodic: bool = False  # late only in the steps of its own extra work (an evaluation every N steps, a recompile)
    compile: RankCompile | None = None  # its compiles, where they are the cause ("recompile")


@dataclass(frozen=True)
class Imbalance:
    """No one rank is late, yet in each step the ranks wait for one another: the work differs from rank to rank
    step by step (batches of different lengths, uneven reads), and each step waits for whichever rank got more."""

    cost_s: float  # per step, what work evened out would save: the ranks' mean wait for the last one
    cost_share: float  # of the median step
    first_wait_s: float  # per step, the mean wait of the rank that arrived first for the one that arrived last
    last_shares: dict[int, float]  # per rank, the share of the measured steps it arrived last in
    # the category the last rank spent most more time in, "recompile" where its compiling holds the wait, or
    # "unexplained"
    cause: Category | Literal["unexplained", "recompile"]
    cause_gap_s: float  # that category's mean per step: the last rank's minus the first rank's
    cpu_gap_s: float | None  # the same for the CPU time of their threads (None: not known)
    larger_input_share: float  # share of the steps whose last rank's forwards took more elements than the first's
    compile_gap_s: float = 0.0  # mean per step: the last rank's compile seconds minus the first rank's
    recompiled: RankCompile | None = None  # where the cause is "recompile": the rank that recompiled most

    @property
    def evidenced(self) -> bool:
        """Uneven work shown, not only turns: the late rank's compiling holds the wait, or its phase does and it had
        the larger batch in 3 steps of 4. Ranks given batches of one size are late in turns from noise as well (a
        core's wait, a slower collective now and then), more so on a loaded machine."""
        if self.cause == "recompile":
            return True
        return self.cause != "unexplained" and self.larger_input_share >= CONSISTENT


@dataclass(frozen=True)
class LaneStep:
    """One measured step of one rank on the ranks' common clock (seconds from the earliest step's start)."""

    step: int
    start_s: float
    end_s: float
    parts_s: dict[RankCategory, float]  # per category (RANK_CATEGORIES), the exposed communication out of compute


@dataclass(frozen=True)
class RankAnalysis:
    ranks: list[RankSummary]
    median_rank: int
    worst_rank: int  # the rank that waits least (the others wait for it)
    skew: float  # (worst's own work - median rank's) / median rank's
    exposed_share: float  # exposed communication over step time, all ranks
    overlap: float | None  # share of the all-reduces' time that ran while backward computed
    straggler: Straggler | None
    imbalance: Imbalance | None = None  # ranks late in turns (only when no straggler is named)
    offsets_s: dict[int, float] = field(default_factory=dict)  # clock offset of each rank to the lowest rank
    steps: list[int] = field(default_factory=list)  # the measured steps every rank has
    lanes: dict[int, tuple[LaneStep, ...]] = field(default_factory=dict)  # per rank, its steps on the common clock
    shared_wait_s: float = 0.0  # per step, the median of the least any rank waited: the wait no lateness explains
    sync_kind: str = "ddp"  # what the ranks' exposed communication is: a key of WAITED_ON

    @property
    def step_s(self) -> float:
        return statistics.median(r.step_s for r in self.ranks)

    @property
    def waited_on(self) -> str:
        """The words for what the ranks wait on: "the gradient all-reduce", "FSDP's all-gathers and ..."."""
        return WAITED_ON[self.sync_kind]


def oversubscribed(recording: Recording, usable_cores: int) -> tuple[list[int], int] | None:
    """The intra-op threads of each rank on ``recording``'s host and the count per rank that fits its cores, when
    together they run more threads than the host has cores and fewer per rank can help; else None."""
    local = [r for r in recording.job if r.host == recording.host]
    threads = [r.threads_seen or 1 for r in local]
    fit = max(1, usable_cores // max(1, len(local)))
    if len(local) < 2 or sum(threads) <= usable_cores or all(t <= fit for t in threads):
        return None
    return threads, fit


def measured_steps(recording: Recording) -> dict[int, StepRecord]:
    """The measured steps by index: after the warm-up, before the profiler window."""
    window = recording.window
    end = window.warmup + window.measure if window.measure is not None else len(recording.steps)
    chosen = {s.index: s for s in recording.steps if window.warmup <= s.index < end and not s.profiled}
    if not chosen:  # too few steps to skip warm-up: what ran
        chosen = {s.index: s for s in recording.steps if not s.profiled} or {s.index: s for s in recording.steps}
    return chosen


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))] if ordered else 0.0


def _per_step(recording: Recording, steps: list[int]) -> list[dict[RankCategory, float]]:
    """Seconds per category for each of ``steps``, the exposed communication out of compute."""
    chosen = measured_steps(recording)
    comm = {c.step: c for c in recording.communication}
    out = []
    for index in steps:
        cats: dict[RankCategory, float] = {k: v for k, v in chosen[index].categories().items() if k in RANK_CATEGORIES}
        exposed = comm[index].exposed_s if index in comm else 0.0
        # The wait happened inside the backward call, charged to compute (or to phases a profiler timed).
        take = min(exposed, cats["compute"])
        cats["compute"] -= take
        cats["communication"] = take
        out.append(cats)
    return out


def _median_of(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _summary(recording: Recording, steps: list[int]) -> RankSummary:
    rows = _per_step(recording, steps)
    comm = {c.step: c for c in recording.communication}
    chosen = measured_steps(recording)
    durations = [chosen[i].duration for i in steps]
    per = {k: [r[k] for r in rows] for k in RANK_CATEGORIES}
    busy = [d - r["communication"] for d, r in zip(durations, rows)]
    return RankSummary(
        rank=recording.rank,
        host=recording.host,
        steps=len(steps),
        step_s=statistics.median(durations),
        step_p90_s=_p90(durations),
        median_s={k: statistics.median(v) for k, v in per.items()},
        p90_s={k: _p90(v) for k, v in per.items()},
        mean_s={k: statistics.fmean(v) for k, v in per.items()},
        exposed_s=statistics.median(per["communication"]),
        busy_s=statistics.median(busy),
        timed_sync=bool(recording.communication),
        cpu_s=_median_of([comm[i].cpu_s if i in comm else None for i in steps]),
        cpu_wait_s=_median_of([comm[i].cpu_wait_s if i in comm else None for i in steps]),
        reducer=dict(recording.reducer),
        comm_busy_s=_median_of([comm[i].busy_s if i in comm else None for i in steps]),
        collectives=_median_of([comm[i].buckets if i in comm else None for i in steps]),
        compile=rank_compile(recording.compiled, chosen, steps),
    )


def _offsets(recordings: list[Recording], steps: list[int]) -> dict[int, float]:
    """Each rank's clock minus the lowest rank's, from the completion of the same all-reduce."""
    base = {c.step: c.done_at for c in recordings[0].communication}
    out = {}
    for rec in recordings:
        mine = {c.step: c.done_at for c in rec.communication}
        diffs = [mine[s] - base[s] for s in steps if s in mine and s in base]
        if diffs:
            out[rec.rank] = statistics.median(diffs)
    return out


def _lanes(recordings: list[Recording], steps: list[int], offsets: dict[int, float]) -> dict[int, tuple[LaneStep, ...]]:
    """Each rank's measured steps on the lowest rank's clock, time zero at the earliest step's start."""
    measured = {r.rank: measured_steps(r) for r in recordings}
    lowest = measured[recordings[0].rank]
    # A rank whose all-reduces were not timed is lined up on its step ends (they follow the same all-reduce).
    shift = {
        r.rank: offsets[r.rank]
        if r.rank in offsets
        else statistics.median(measured[r.rank][s].end - lowest[s].end for s in steps)
        for r in recordings
    }
    zero = min(measured[r.rank][steps[0]].start - shift[r.rank] for r in recordings)
    out = {}
    for rec in recordings:
        chosen = measured[rec.rank]
        out[rec.rank] = tuple(
            LaneStep(
                step=index,
                start_s=chosen[index].start - shift[rec.rank] - zero,
                end_s=chosen[index].end - shift[rec.rank] - zero,
                parts_s=parts,
            )
            for index, parts in zip(steps, _per_step(rec, steps))
        )
    return out


def _imbalance(
    recordings: list[Recording],
    steps: list[int],
    exposed: dict[int, list[float]],
    step_s: float,
    summaries: list[RankSummary],
) -> Imbalance | None:
    """Ranks late in turns: per step, the first rank to arrive (it waited most) against the last (least)."""
    if step_s <= 0:
        return None
    compiling = _compile_per_step(summaries, steps)
    compile_gaps = []
    rows = {r.rank: _per_step(r, steps) for r in recordings}
    cpu = {r.rank: {c.step: c.cpu_s for c in r.communication} for r in recordings}
    waits, saved, gaps = [], [], {k: 0.0 for k in RANK_CATEGORIES if k != "communication"}
    cpu_gaps, last, larger = [], [], 0
    inputs = {r.rank: r.input_numel for r in recordings}
    for i, index in enumerate(steps):
        first = max(exposed, key=lambda rank: exposed[rank][i])
        late = min(exposed, key=lambda rank: exposed[rank][i])
        last.append(late)
        larger += inputs[late].get(index, 0) > inputs[first].get(index, 0)
        waits.append(exposed[first][i] - exposed[late][i])
        # Evened out, a step takes the ranks' mean work instead of the most any rank got.
        saved.append(statistics.fmean(exposed[rank][i] - exposed[late][i] for rank in exposed))
        for k in gaps:
            gaps[k] += (rows[late][i][k] - rows[first][i][k]) / len(steps)
        compile_gaps.append(compiling[late][i] - compiling[first][i])
        late_cpu, first_cpu = cpu[late].get(index), cpu[first].get(index)
        if late_cpu is not None and first_cpu is not None:
            cpu_gaps.append(late_cpu - first_cpu)
    first_wait = statistics.fmean(waits)
    cost = statistics.fmean(saved)
    shares = {r.rank: last.count(r.rank) / len(last) for r in recordings}
    if first_wait / step_s < IMBALANCE_SHARE or max(shares.values()) >= CONSISTENT:
        return None
    largest = max(gaps, key=lambda k: gaps[k])
    # Under half the wait: no phase of the late ranks holds it, step-to-step noise as well.
    cause: Category | Literal["unexplained", "recompile"] = (
        "unexplained" if gaps[largest] < 0.5 * first_wait else largest
    )
    compile_gap = statistics.fmean(compile_gaps)
    recompiled = None
    # Compile time is charged to the phase that called the compiled code: where it holds half the wait, each rank
    # was late in the steps it compiled again (inputs of new shapes reaching the ranks at different steps).
    if compile_gap >= 0.5 * first_wait:
        cause = "recompile"
        recompiled = max((s.compile for s in summaries if s.compile), key=lambda c: (c.recompiles, c.window_s))
    return Imbalance(
        cost_s=cost,
        cost_share=cost / step_s,
        first_wait_s=first_wait,
        last_shares=shares,
        cause=cause,
        cause_gap_s=max(gaps.values()),
        cpu_gap_s=statistics.fmean(cpu_gaps) if len(cpu_gaps) == len(steps) else None,
        larger_input_share=larger / len(steps),
        compile_gap_s=compile_gap,
        recompiled=recompiled,
    )


def _compile_per_step(summaries: list[RankSummary], steps: list[int]) -> dict[int, tuple[float, ...]]:
    """Per rank, its compile seconds in each of ``steps`` (zeros for a rank that compiled none)."""
    return {s.rank: s.compile.per_step_s if s.compile else (0.0,) * len(steps) for s in summaries}


def _median_other(summaries: list[RankSummary], rank: int) -> RankSummary:
    """The median (the lower of two) by own work of the ranks other than ``rank``: what it is compared with."""
    others = sorted((s for s in summaries if s.rank != rank), key=lambda s: s.busy_s)
    return others[(len(others) - 1) // 2]


def _late_for_own_work(
    exposed: dict[int, list[float]], work: Mapping[int, Sequence[float]], step: float
) -> dict[int, tuple[float, list[int]]]:
    """Per rank late in some steps for work of one kind only it did there (``work``: per rank, its seconds of that
    work in each step): its cost (the others' wait for it in those steps, averaged over every step) and those steps,
    where they are two or more and the cost is a straggler's. A step counts where the rank's work exceeds the least
    any other rank did by half the others' wait for it: on a balanced job that work is nobody's, and a wait another
    step has (a core taken by another process) is noise, not counted."""
    found = {}
    count = len(next(iter(exposed.values())))
    for rank in exposed:
        others = [o for o in exposed if o != rank]
        waits = [max(0.0, min(exposed[o][i] for o in others) - exposed[rank][i]) for i in range(count)]
        explained = [
            i
            for i, wait in enumerate(waits)
            if wait >= STRAGGLER_SHARE * step and work[rank][i] - min(work[o][i] for o in others) >= 0.5 * wait
        ]
        cost = sum(waits[i] for i in explained) / count
        if len(explained) >= 2 and cost >= STRAGGLER_SHARE * step:
            found[rank] = (cost, explained)
    return found


def _periodic_straggler(
    recordings: list[Recording], steps: list[int], exposed: dict[int, list[float]], summaries: list[RankSummary]
) -> tuple[Straggler, list[int]] | None:
    """A rank late in some steps for work only it does there, which the median the steady straggler is judged by
    does not see when the work skips steps: work between steps every few steps (rank 0 evaluating every N steps),
    or, where it alone does so, compiling again (a new input shape only it met). Its cost is the others' wait in
    those steps averaged over every step. With it, the positions in ``steps`` of the steps it was late in."""
    step = statistics.fmean(sum(s.mean_s.values()) for s in summaries)  # the mean step: the work is amortised
    if step <= 0:
        return None
    rows = {r.rank: _per_step(r, steps) for r in recordings}
    between = _late_for_own_work(exposed, {r: [row["outside_step"] for row in rows[r]] for r in rows}, step)
    cause: LateCause = "outside_step"
    found = max(between.items(), key=lambda kv: kv[1][0], default=None)
    if found is None:
        compiling = _late_for_own_work(exposed, _compile_per_step(summaries, steps), step)
        # Ranks late in turns each for its own recompiles are uneven work (_imbalance), not one rank's lateness.
        if len(compiling) != 1:
            return None
        (found,) = compiling.items()
        cause = "recompile"
    rank, (cost, late) = found
    rec = next(r for r in recordings if r.rank == rank)
    median = _median_other(summaries, rank)
    gap = {
        k: statistics.fmean(rows[rank][i][k] - rows[median.rank][i][k] for i in late)
        for k in RANK_CATEGORIES
        if k != "communication"
    }
    compiled = next(s.compile for s in summaries if s.rank == rank) if cause == "recompile" else None
    return Straggler(
        rank=rank,
        host=rec.host,
        cause=cause,
        cost_s=cost,
        cost_share=cost / step,
        compared_with=median.rank,
        gap_s=gap,
        last_share=len(late) / len(steps),
        site=compiled.site if compiled is not None else _cause_site(rec, cause, steps),
        periodic=True,
        compile=compiled,
    ), late


def _cause_site(recording: Recording, cause: str, steps: list[int]) -> Site | None:
    """The line that explains the straggler's cause on its own recording, when one is known."""
    if cause == "data_loading":
        waits = [(r.nexts.total(steps)[1], r.site) for r in recording.loaders if r.site is not None]
        if waits:
            return max(waits, key=lambda w: w[0])[1]
        samples = sorted(recording.gap_samples, key=lambda g: -g.count)
        return samples[0].site if samples else None
    kinds = {"outside_step": ("save", "eval_forward", "eval"), "host_sync": ("sync:",)}.get(cause)
    if kinds:
        events = [
            (e.total(steps)[1], e.site) for e in recording.events if e.site is not None and e.kind.startswith(kinds)
        ]
        if events:
            return max(events, key=lambda w: w[0])[1]
    return None


def _same_work(a: Recording, b: Recording, steps: list[int]) -> bool:
    """Both ranks ran the same work in ``steps``: as many module calls, the same matmul shapes at the same lines, and
    as many input elements per step (False where the recordings do not say)."""
    if not a.module_calls_per_step or a.module_calls_per_step != b.module_calls_per_step:
        return False

    def shapes(r: Recording) -> set[tuple[str, int, tuple[int, ...], tuple[int, ...]]]:
        return {(m.site.file, m.site.line, m.a, m.b) for m in r.matmul_shapes}

    def inputs(r: Recording) -> list[int | None]:
        return [r.input_numel.get(i) for i in steps]

    return shapes(a) == shapes(b) and inputs(a) == inputs(b)


def analyse_ranks(recordings: list[Recording] | tuple[Recording, ...]) -> RankAnalysis | None:
    """The ranks side by side (None with fewer than two ranks that measured steps in common)."""
    recordings = sorted((r for r in recordings if r.steps), key=lambda r: r.rank)
    if len(recordings) < 2:
        return None
    common = set.intersection(*(set(measured_steps(r)) for r in recordings))
    steps = sorted(common)
    if not steps:
        return None
    summaries = [_summary(r, steps) for r in recordings]
    exposed = {r.rank: [row["communication"] for row in _per_step(r, steps)] for r in recordings}
    # Per step, the rank that waited least arrived last.
    last = [min(exposed, key=lambda rank: exposed[rank][i]) for i in range(len(steps))]
    worst = min(summaries, key=lambda s: (s.exposed_s, -s.busy_s))
    others = [s for s in summaries if s.rank != worst.rank]
    median = _median_other(summaries, worst.rank)
    # Every step loses the least any other rank waited beyond the straggler's own wait.
    waits = [min(exposed[o.rank][i] for o in others) - exposed[worst.rank][i] for i in range(len(steps))]
    cost = max(0.0, statistics.median(waits))
    spread = statistics.median(abs(w - cost) for w in waits)
    # A steady straggler makes the others wait in (nearly) every step; one whose wait skips steps (work every
    # other step) has a median that is one mode of two, and is judged by its average (_periodic_straggler).
    # A step still shows the wait when it is within the job's own step-to-step noise of the cost: two ranks and
    # their transfer threads on a few cores are descheduled for milliseconds in any step.
    shows_wait = min(0.5 * cost, cost - NOISE_SPREADS * spread)
    step = statistics.median(s.step_s for s in summaries)
    # A wait that work only one rank does explains, in fewer steps than a steady straggler's, while the other steps
    # wait little, skips steps whatever the median says: with an even count of steps the median of two modes falls
    # between them, and a few noisy steps make their spread pass for noise around it.
    periodic = _periodic_straggler(recordings, steps, exposed, summaries)
    skips = False
    if periodic is not None and periodic[0].last_share < CONSISTENT and periodic[0].rank == worst.rank:
        rest = [w for i, w in enumerate(waits) if i not in periodic[1]]
        skips = not rest or statistics.median(rest) < STRAGGLER_SHARE * step
    steady = not skips and sum(w >= shows_wait for w in waits) >= CONSISTENT * len(waits)
    total_step = sum(s.mean_s[k] for s in summaries for k in RANK_CATEGORIES)
    total_exposed = sum(s.mean_s["communication"] for s in summaries)
    busy = sum(c.busy_s for r in recordings for c in r.communication if c.step in common)
    overlapped = sum(c.overlap_s for r in recordings for c in r.communication if c.step in common)
    straggler = None
    last_share = last.count(worst.rank) / len(last)
    if (
        step > 0
        and cost / step >= STRAGGLER_SHARE
        and last_share >= CONSISTENT
        and cost > ABOVE_SPREAD * spread
        and steady
        and worst.timed_sync
    ):
        gap = {k: worst.median_s[k] - median.median_s[k] for k in RANK_CATEGORIES if k != "communication"}
        largest = max(gap, key=lambda k: gap[k])
        cause: LateCause = "unexplained" if gap[largest] < 0.25 * cost else largest
        contention = cpu_gap = None
        # Only on a CPU run: a GPU's compute is not the thread's CPU time.
        on_cpu = all((r.facts.device if r.facts else "cpu") == "cpu" for r in recordings)
        rec = next(r for r in recordings if r.rank == worst.rank)
        if (
            worst.cpu_wait_s is not None
            and median.cpu_wait_s is not None
            and worst.cpu_s is not None
            and median.cpu_s is not None
        ):
            contention, cpu_gap = worst.cpu_wait_s - median.cpu_wait_s, worst.cpu_s - median.cpu_s
            # Late on work that is all CPU, without using more CPU than the others: its thread waited for a core
            # (other processes, the hypervisor), the machine's cause.
            if on_cpu and cause in CPU_BOUND and cpu_gap < 0.25 * cost:
                cause = "cpu_contention"
        if (
            on_cpu
            and cause in CPU_BOUND
            and _same_work(rec, next(r for r in recordings if r.rank == median.rank), steps)
        ):
            # Late on the very work the others did (the same module calls, matmul shapes and input elements): its
            # core ran slower, shared with other processes or a hyperthread sibling, which also costs CPU time
            # (a clean 2-rank job on 2 vCPUs: rank 1's compute 16% longer, with more CPU time than rank 0's).
            cause = "cpu_contention"
        # Compile time is charged to the phase that called the compiled code (compute, mostly): it is the cause.
        if compile_explains(worst.compile, median.compile, cost, cause in (*CPU_BOUND, "cpu_contention")):
            cause = "recompile"
        straggler = Straggler(
            rank=worst.rank,
            host=worst.host,
            cause=cause,
            cost_s=cost,
            cost_share=cost / step,
            compared_with=median.rank,
            gap_s=gap,
            last_share=last_share,
            site=worst.compile.site if cause == "recompile" and worst.compile else _cause_site(rec, cause, steps),
            contention_s=contention,
            cpu_gap_s=cpu_gap,
            compile=worst.compile if cause == "recompile" else None,
        )
    if straggler is None and periodic is not None:
        straggler = periodic[0]
    imbalance = None if straggler is not None else _imbalance(recordings, steps, exposed, step, summaries)
    offsets = _offsets(recordings, steps)
    kinds = [c.kind for r in recordings for c in r.communication if c.step in common]
    kind = statistics.mode(kinds) if kinds else "ddp"
    return RankAnalysis(
        ranks=summaries,
        median_rank=median.rank,
        worst_rank=worst.rank,
        skew=(worst.busy_s - median.busy_s) / median.busy_s if median.busy_s > 0 else 0.0,
        exposed_share=total_exposed / total_step if total_step > 0 else 0.0,
        shared_wait_s=statistics.median(min(exposed[r][i] for r in exposed) for i in range(len(steps))),
        # Blocking calls overlap nothing by construction: no share to report.
        overlap=overlapped / busy if busy > 0 and kind == "ddp" else None,
        straggler=straggler,
        imbalance=imbalance,
        offsets_s=offsets,
        steps=steps,
        lanes=_lanes(recordings, steps, offsets),
        sync_kind=kind,
    )
