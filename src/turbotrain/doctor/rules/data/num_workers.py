"""`num-workers`: the step waits on data (DataLoader with too few workers, or batches built in the loop).

Reads: run.
Edit: `num_workers=N, persistent_workers=True` in that `DataLoader(...)` call (N: the what-if's best count; none where
the what-if found no count faster than the script's).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from ...edits import ByHand, EditSpec
from ...findings import Evidence, Finding, Fix, speedup_for_rule
from ...record.cadence import syntax_tree
from ...requests import LoaderRequest
from ...sites import Site
from ..common import loader_edit, ms, on_a_job
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


def loader_fix(num_workers: int) -> str:
    """The DataLoader line for ``num_workers``: PyTorch refuses persistent_workers=True without workers."""
    persistent = ", persistent_workers=True" if num_workers > 0 else ""
    return f"DataLoader(..., num_workers={num_workers}{persistent})"


def workers_fix(workers: int) -> Fix:
    """The fix for a loader given ``workers``, in every framework (the what-if says it again with its measured
    best count)."""
    return Fix(
        loader_fix(workers),
        plan={"num_workers": workers},
        lightning=f"DataLoader(..., num_workers={workers}) (Lightning passes your loader through)",
        accelerate=f"DataLoader(..., num_workers={workers}) before accelerator.prepare(...)",
        hf_trainer=f"TrainingArguments(dataloader_num_workers={workers})",
    )


def no_faster_count_fix(current: int, rates: dict[int, float]) -> Fix:
    """The fix where the loader rates measured no worker count faster than the script's own: more workers do not
    help, each batch's own building is what the step waits on."""
    said = ", ".join(f"{workers} worker(s) {rate:.0f}" for workers, rate in rates.items())
    return Fix(
        f"Keep num_workers={current}: no count loaded faster here (batches/s: {said}). The wait is each batch's own "
        "building: make it cheaper (a transform done once on the whole dataset, or on the batch rather than per "
        "sample)"
    )


@dataclass(frozen=True)
class DataWaitEvidence(Evidence):
    data_ms_per_step: float
    sampled_lines: dict[str | None, int] | None = None  # without a DataLoader: the lines caught building batches
    num_workers: int | None = None  # with one: its workers


def num_workers(ctx: Context) -> Iterator[Finding]:
    share = ctx.share("data_loading")
    if share < 0.10:
        return
    data_s = ctx.seconds("data_loading")
    record = ctx.main_loader
    cores = max(1, ctx.hw.cpu_cores)
    # Work in a few steps only before the forward (a plot when an episode ends) is neither batch building nor the
    # loader's: periodic-work names it.
    occasional = ctx.occasional_work
    sampled = dict(ctx.gap_samples)
    if occasional is not None:
        data_s -= occasional.cost_s / occasional.every
        sampled.pop(occasional.site, None)
        share = data_s / ctx.step_s if ctx.step_s else 0.0
        if share < 0.10:
            return
    if record is None:
        # Without a DataLoader nothing can be timed with workers; a batch built in well under a
        # millisecond would not pay for a worker's inter-process hand-off either. Time the run
        # already pinned on a line (torch.tensor copies) has its own finding and fix.
        data_s -= sum(stat.seconds_per_step for stat in ctx.site_stats("tensor_copy"))
        share = data_s / ctx.step_s if ctx.step_s else 0.0
        if share < 0.20 or data_s < 1e-3:
            return
        busiest = max(sampled.items(), key=lambda kv: kv[1], default=(None, 0))[0]
        if busiest is not None and _in_periodic_branch(busiest):
            return  # work the script runs every N steps (a plot, a log), not batch building: periodic-work's
        site = busiest or (ctx.capture.site if ctx.capture else None)
        f = Finding(
            "num-workers",
            site=site,
            category="data_loading",
            message=(
                f"{share:.0%} of each step ({ms(data_s)}) goes to making the next batch in the training "
                "process itself (no DataLoader): the model waits while the batch is built."
            ),
            fix=Fix(
                "Move the per-batch work into a torch.utils.data.Dataset and iterate "
                f"DataLoader(dataset, batch_size=..., num_workers={min(4, cores)}, persistent_workers=True), so "
                "worker processes build batches while the model trains; or precompute the data once."
            ),
            evidence=DataWaitEvidence(
                data_ms_per_step=round(data_s * 1e3, 3),
                sampled_lines={ctx.where(k): v for k, v in sorted(sampled.items(), key=lambda kv: -kv[1])[:5]},
            ),
        )
        f.set_gain(share, measured=False)
        f.note = "est_speedup is the upper bound: all of the batch preparation hidden behind compute."
        if busiest is None:
            f.note += " No line was caught building a batch (the sampler saw none): the site is the model's call."
        yield f
        return
    workers = record.settings["num_workers"]
    suggest = max(2, min(4, cores)) if workers == 0 else workers * 2
    if on_a_job(ctx):  # the ranks on this host share its cores: each rank's workers fit its share
        assert ctx.recording is not None  # on_a_job
        host = ctx.recording.host
        per_rank = cores // sum(1 for r in ctx.recording.job if r.host == host)
        suggest = min(suggest, max(1, per_rank))
    f = Finding(
        "num-workers",
        site=record.site,
        category="data_loading",
        speedup=speedup_for_rule("num-workers"),
        message=(
            f"{share:.0%} of step time ({ms(data_s)} per step) waits on the DataLoader, "
            + (
                "which loads every batch in the training process (num_workers=0)."
                if workers == 0
                else f"even with num_workers={workers}."
            )
        ),
        fix=workers_fix(suggest),
        evidence=DataWaitEvidence(data_ms_per_step=round(data_s * 1e3, 3), num_workers=workers),
        request=LoaderRequest(),
    )
    f.set_gain(share, measured=False)
    f.note = "est_speedup is the upper bound until the worker counts are timed."
    if _without_the_slowest(ctx, data_s) < 1e-3:
        # Handing a batch over from a worker process costs about this much itself.
        f.cap("low", "Each batch loads in under a millisecond; workers may not win it back.")
    yield f


def _without_the_slowest(ctx: Context, data_s: float) -> float:
    """``data_s`` (seconds a measured step waits on data) less what its slowest step alone added to it: one slow
    batch in the window is no rate (the machine stalled, a file was cold), so it cannot lift batches of 0.4 ms over
    the bar on its own."""
    measured = set(ctx.measured_steps)
    waits = [s.categories()["data_loading"] for s in ctx.step_records if s.index in measured]
    if len(waits) < 4:
        return data_s  # too few steps to tell one slow batch from a rate
    others = (sum(waits) - max(waits)) / (len(waits) - 1)
    return data_s - max(0.0, max(waits) - others) / len(waits)


def _in_periodic_branch(site: Site) -> bool:
    """Whether ``site`` lies in an ``if`` whose test takes a remainder (``if step % 50 == 0:``), its test's line
    included: a sampler can catch a one-line branch, or a body that calls into a library, there."""
    tree = syntax_tree(site.file)
    if tree is None:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and any(
            isinstance(t, ast.BinOp) and isinstance(t.op, ast.Mod) for t in ast.walk(node.test)
        ):
            body = node.body  # the branch that runs every N steps, from its test (``if step % 50 == 0: plot()``)
            if node.lineno <= site.line <= (body[-1].end_lineno or body[-1].lineno):
                return True
    return False


def edit(ctx: Context, f: Finding) -> EditSpec:
    if not isinstance(f.request, LoaderRequest):
        raise ByHand(
            "the batches are built in the loop, not by a DataLoader: move that work into a Dataset "
            "read by DataLoader(..., num_workers=N)"
        )
    if f.fix.plan is None and f.measured:  # the loader rates found no count faster than the script's
        raise ByHand("no worker count loaded faster than the script's own: nothing to edit at the DataLoader")
    workers = int((f.fix.plan or {}).get("num_workers", 2))
    params: dict[str, Any] = {"num_workers": workers}
    if workers > 0:
        params["persistent_workers"] = True
    return loader_edit(params)


RULE = register(Rule("num-workers", detect=(Detect("runtime", num_workers),), edit=edit))
