"""What several rules share: step-time text, the job's ranks, the user's sources, a Plan switch's finding."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any, Iterator

from ...speedups.registry import by_field
from ..analysis.ranks import oversubscribed
from ..analysis.source import SourceIndex
from ..edits import ByHand, EditSpec
from ..findings import Finding, Fix, speedup_for_rule
from ..requests import JobRequest, PlanRequest
from ..sites import Site

if TYPE_CHECKING:
    from ..analysis.context import Context, SiteStat


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


def timed_sites(ctx: Context, kind: str) -> Iterator[tuple[SiteStat, float]]:
    """(per-site stats, share of step time) of events of ``kind`` that ran in the measured steps."""
    for stat in ctx.ran_sites(kind):
        yield stat, (stat.seconds_per_step / ctx.step_s if ctx.step_s else 0.0)


def for_this_model(ctx: Context, field: str) -> bool:
    """Whether the speed-up switching Plan.``field`` is for this model (its declared ``applies_to``)."""
    return by_field(field).applies_to(ctx.info)


def switch_finding(ctx: Context, rule_id: str, message: str, fix: Fix, measurable: bool = True) -> Finding:
    """A finding about the model that one Plan switch answers, timed by a what-if on the captured batch."""
    plan = fix.plan
    assert plan is not None  # a Plan switch's fix
    field = next(iter(plan))
    return Finding(
        rule_id,
        site=ctx.capture.site if ctx.capture else None,
        category="compute",
        message=message,
        fix=fix,
        speedup=speedup_for_rule(rule_id, field),
        request=PlanRequest(dict(plan)) if measurable else None,
    )


def sources(ctx: Context) -> list[SourceIndex]:
    return list(ctx.sources.values())


def static_finding(rule_id: str, index: SourceIndex, node: ast.AST, message: str, fix: Fix, **kw: Any) -> Finding:
    f = Finding(rule_id, site=index.site(node), message=message, fix=fix, **kw)
    f.provisional("low")
    return f


def ran_per_step(ctx: Context, kind: str, site: Site) -> float:
    """Per-step count of events of ``kind`` recorded at ``site``'s line during the measured steps."""
    stat = ctx.stat_at(kind, site)
    return stat.per_step if stat else 0.0


CAUSE_WORDS = {
    "data_loading": "its data loading",
    "host_to_device": "its host-to-device copies",
    "compute": "its compute (forward and backward)",
    "optimizer": "its optimizer step",
    "host_sync": "its host syncs",
    "outside_step": "work only it does between steps",
    "unexplained": "time no phase explains",
    "recompile": "torch.compile compiling again on it where the others did not",
    "cpu_contention": "a slower CPU for the same work (it waited for a core, or ran the others' very work "
    "slower: other processes, a hyperthread sibling or the hypervisor held its core)",
}


def on_a_job(ctx: Context) -> bool:
    """The recording is one rank's of a multi-process job the doctor gathered (two or more ranks)."""
    return ctx.recording is not None and len(ctx.recording.job) >= 2


def call_site(ctx: Context, name: str, keyword: str | None = None) -> Site | None:
    """The first call to ``name`` in the user's sources (with ``keyword`` among its arguments, if given)."""
    for index in ctx.sources.values():
        for call, _ in index.calls(name):
            if keyword is None or any(k.arg == keyword for k in call.keywords):
                return index.site(call)
    return None


def cap_if_oversubscribed(ctx: Context, finding: Finding) -> None:
    """On cores the ranks oversubscribe, which rank is late is the scheduler's choice as much as the script's."""
    recording = ctx.recording
    if recording is None or ctx.on_gpu or ctx.machine is None:
        return
    usable = ctx.machine.usable_cores or 1
    found = oversubscribed(recording, usable)
    if found is not None:
        finding.cap(
            "low",
            f"The ranks on {recording.host or 'this host'} run {sum(found[0])} threads on {usable} usable core(s) "
            "(cpu-oversubscribed): which rank is late is the scheduler's choice as much as the script's. Fix the "
            "threads first, then see which rank is still late.",
        )


def reducers(ctx: Context) -> list[dict[str, float]]:
    """DDP's reducer statistics and settings on every rank (the one process's off a job); empty without DDP."""
    recording = ctx.recording
    if recording is None:
        return []
    return [r.reducer for r in (recording.job or (recording,)) if "find_unused_parameters" in r.reducer]


MIB = 1 << 20


# A phase over this share of the step must be explained by a finding with a line.
ATTRIBUTED_SHARE = 0.10


def loader_edit(params: dict[str, Any], where: str = "") -> EditSpec:
    """The DataLoader call's keywords set to ``params``."""
    label = "DataLoader(" + ", ".join(f"{k}={v!r}" for k, v in params.items()) + ")" + where
    return EditSpec("loader", label, params=params)


def rank_change_edit(ctx: Context, f: Finding) -> EditSpec:
    """A job's fix timed on every rank, as the edit of the line it names: DDP's or FSDP's keywords, the thread
    count, the checkpoint's cadence or the loader's workers (a branch's period: the straggler's own edit)."""
    change = f.request.change if isinstance(f.request, JobRequest) else None
    if change is None:
        raise ByHand(f.fix.pytorch)
    if change.ddp:
        keywords = ", ".join(f"{k}={v!r}" for k, v in change.ddp.items())
        return EditSpec("ddp", f"DistributedDataParallel(..., {keywords})", params={"keywords": dict(change.ddp)})
    if change.fsdp:
        keywords = ", ".join(f"{k}={v!r}" for k, v in change.fsdp.items())
        return EditSpec("fsdp", f"fully_shard(..., {keywords})", params={"keywords": dict(change.fsdp)})
    if change.save_every is not None:
        label = f"torch.save every {change.save_every} steps (was every step)"
        return EditSpec("save_every", label, params={"every": change.save_every})
    if change.loader_workers is not None:
        return loader_edit({"num_workers": change.loader_workers, "persistent_workers": True}, " on every rank")
    if change.threads is not None:
        label = f"torch.set_num_threads({change.threads}) on every rank"
        return EditSpec("threads", label, params={"threads": change.threads})
    raise ByHand(f.fix.pytorch)
