"""`cpu-oversubscribed`: intra-op threads above the cores really free, or threads + workers above the usable cores
(threads and workers timed); on a job, the ranks on a host running more threads together than it has cores (cores //
ranks timed on every rank).

Reads: machine + run.
Applies to: a CPU.
Edit: on a job, the thread count timed on every rank in the script's own `torch.set_num_threads(N)` call, or, where
the script sets none and spawns its ranks, that call as the first line of the function they run.
"""

from __future__ import annotations

import ast
import dataclasses

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ....speedups.cpu_threads import fit_to_cores
from ...analysis.ranks import oversubscribed
from ...findings import Evidence, Finding, Fix, speedup_for_rule
from ...rank_change import RankChange
from ...requests import JobRequest, ThreadsRequest
from ...sites import Site
from ..common import call_site, on_a_job, rank_change_edit
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


# Background load below a quarter of a core (a shell, a logger) leaves a core free. A neighbour pinned to one
# core gets only about half of it while our own threads also want it, so half a core busy is a taken core.
BACKGROUND_CORES = 0.25


@dataclass(frozen=True)
class ThreadsEvidence(Evidence):
    """One process's threads and workers, and those to use (the threads what-if's best, once it has timed them)."""

    threads: int
    workers: int
    usable_cores: int | None
    other_load: float  # other processes' busy cores
    recommended_threads: int
    recommended_workers: int


@dataclass(frozen=True)
class RankThreadsEvidence(Evidence):
    """The ranks on one host: each one's threads, and the count that fits the host's cores."""

    ranks_on_host: int
    threads: tuple[int, ...]
    usable_cores: int
    recommended_threads: int


def free_cores(usable: int, others: float) -> int:
    """Whole cores left to this job when other processes keep ``others`` cores busy (at least 1)."""
    return max(1, int(usable - others + BACKGROUND_CORES))


def recommended(ctx: Context) -> tuple[int, int, int, int, float] | None:
    """(threads now, workers now, threads to use, workers to use, other processes' busy cores), or None
    when the run's threads and workers fit the cores that were free."""
    m = ctx.machine
    if ctx.on_gpu or m is None:
        return None
    usable, threads = m.usable_cores or 1, m.intra_op_threads or 1
    record = ctx.main_loader
    workers = record.settings.get("num_workers", 0) if record is not None else 0
    others = m.other_load or 0.0
    # Workers that sat idle over the window (a queue kept full ahead of a long step) take no core from the threads.
    idle = m.worker_load is not None and m.worker_load < BACKGROUND_CORES
    if threads <= usable - others + BACKGROUND_CORES and (idle or threads + workers <= usable):
        return None
    k, w = fit_to_cores(free_cores(usable, others), workers, threads)
    if (k, w or 0) == (threads, workers):
        return None  # already as few as can be (one thread, no workers): a busy machine is noise, told at the top
    return threads, workers, k, w or 0, others


def candidates(ctx: Context, found: tuple[int, int, int, int, float]) -> list[tuple[int, int]]:
    """The (threads, workers) settings the what-if times against the script's: the fitted one, and with
    workers none at all (cheap batches cost less in the training process than an inter-process hand-off)."""
    threads, workers, k, w, others = found
    assert ctx.machine is not None  # recommended(ctx) read it
    free = free_cores(ctx.machine.usable_cores or 1, others)
    out = [(k, w), (fit_to_cores(free, 0, threads)[0], 0)]
    return [c for i, c in enumerate(out) if c not in out[:i] and c != (threads, workers)]


def threads_fix(threads: int, workers_now: int, workers: int, threads_now: int | None = None) -> Fix:
    """``threads`` intra-op threads (and ``workers`` DataLoader workers where they change), said in each
    framework's way; the environment variable, once set, is what Lightning and Fabric keep. Where the threads are
    ``threads_now`` already and only the workers change, the workers are the fix."""
    env = f"OMP_NUM_THREADS={threads}"
    call = f"torch.set_num_threads({threads})"
    loader = f", and DataLoader(..., num_workers={workers})" if workers != workers_now else ""
    if threads == threads_now and workers != workers_now:
        kept = f" (torch's {threads} intra-op thread(s) as they are)"
        return Fix(
            f"DataLoader(..., num_workers={workers}){kept}",
            plan={"num_workers": workers},
            hf_trainer=f"TrainingArguments(dataloader_num_workers={workers}){kept}",
        )
    return Fix(
        f"{call} at the top of the script (or {env} in its environment){loader}",
        plan={"intra_op_threads": threads, **({"num_workers": workers} if workers != workers_now else {})},
        lightning=f"{env} in the environment of the run (set, it overrides any count Lightning would pick){loader}",
        fabric=f"{env} in the environment of `fabric run`, or {call} after Fabric(...) (and its launch(), if the "
        f"script calls it){loader}",
        accelerate=f"{env} in the environment, or {call} before accelerator.prepare{loader}",
        hf_trainer=f"{env} in the environment, or {call} before Trainer(...)"
        + (f", and TrainingArguments(dataloader_num_workers={workers})" if workers != workers_now else ""),
    )


def cpu_oversubscribed(ctx: Context) -> Iterator[Finding]:
    if on_a_job(ctx):
        return  # on a job the other ranks are not other load: rules/ranks.py counts every rank's threads
    found = recommended(ctx)
    if found is None or ctx.capture is None:
        return
    threads, workers, k, w, others = found
    assert ctx.machine is not None  # recommended(ctx) read it
    usable = ctx.machine.usable_cores
    busy = f"; other processes kept {others:.1f} of them busy" if others >= 0.5 else ""
    f = Finding(
        "cpu-oversubscribed",
        site=ctx.main_loader.site if ctx.main_loader and w != workers else None,
        where=None,
        category="compute",
        speedup=speedup_for_rule("cpu-oversubscribed"),
        message=(
            f"torch runs {threads} intra-op thread(s) and the DataLoader {workers} worker(s) on {usable} usable "
            f"core(s){busy}: parallel ops wait at a barrier for threads that have no core."
        ),
        fix=threads_fix(k, workers, w, threads),
        evidence=ThreadsEvidence(
            threads=threads,
            workers=workers,
            usable_cores=usable,
            other_load=others,
            recommended_threads=k,
            recommended_workers=w,
        ),
        request=ThreadsRequest(tuple(candidates(ctx, found))),
    )
    f.provisional("medium")
    f.note = "Threads and workers are timed on your model and DataLoader, interleaved with what the script uses."
    yield f


def ranks_oversubscribed(ctx: Context) -> Iterator[Finding]:
    """The ranks on this host run more intra-op threads together than the host has cores."""
    if not on_a_job(ctx) or ctx.on_gpu or ctx.machine is None:
        return
    recording = ctx.recording
    assert recording is not None  # on_a_job
    usable = ctx.machine.usable_cores or 1
    found = oversubscribed(recording, usable)
    if found is None:
        return  # they fit, or more ranks than cores: fewer threads cannot help
    threads, fit = found
    site = call_site(ctx, "set_num_threads")
    entry = _spawned_function(ctx) if site is None else None
    # Every rank, not one process: the launcher's environment is the one place that reaches them all.
    pytorch = (
        f"torch.set_num_threads({fit}) in every rank (cores // ranks per node), or OMP_NUM_THREADS={fit} in the "
        "launcher's environment (torchrun sets 1 unless told otherwise)"
    )
    if entry is not None:  # no count of its own: the spawned function's first line reaches every rank
        site = entry
        pytorch = (
            f"torch.set_num_threads({fit}) as the first line of {entry.function}(), which every spawned rank runs "
            f"(cores // ranks per node): torch.multiprocessing.spawn, unlike torchrun, leaves each rank all the cores"
        )
    fix = dataclasses.replace(threads_fix(fit, 0, 0), pytorch=pytorch)
    finding = Finding(
        rule="cpu-oversubscribed",
        site=site,
        category="compute",
        speedup=speedup_for_rule("cpu-oversubscribed"),
        message=(
            f"{len(threads)} ranks on {recording.host or 'this host'} run {'+'.join(map(str, threads))} intra-op "
            f"threads on {usable} usable core(s): each rank's parallel ops wait at a barrier for threads the "
            "other ranks' threads keep off a core."
        ),
        fix=fix,
        evidence=RankThreadsEvidence(
            ranks_on_host=len(threads), threads=tuple(threads), usable_cores=usable, recommended_threads=fit
        ),
        request=JobRequest(RankChange(threads=fit)),
    )
    finding.provisional("medium")
    yield finding


def _spawned_function(ctx: Context) -> Site | None:
    """The ``def`` of the function the script's ``torch.multiprocessing.spawn`` (or ``start_processes``) runs in
    each rank, where it is defined in the same file."""
    for index in ctx.sources.values():
        for call, _ in index.calls("multiprocessing.spawn", "start_processes", "spawn"):
            target = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "fn"), None)
            if not isinstance(target, ast.Name):
                continue
            for node in index.tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == target.id:
                    return Site(index.path, node.lineno, node.name)
    return None


RULE = register(
    Rule(
        "cpu-oversubscribed",
        detect=(
            Detect("runtime", cpu_oversubscribed),
            Detect("runtime", ranks_oversubscribed),
        ),
        edit=rank_change_edit,
    )
)
