"""Recurring work between steps (validation, checkpoints), as the report's rows: its kind, its line, what it
costs amortised over its period, and the cadence at which it would cost under 5% of training time.

Work at a period beyond the window comes from the step clock watched after it (:func:`watched_periodic`); the
breakdown amortises it into its step like the window's own.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from ..record.cadence import Cadence
from ..record.recurring import Periodic
from ..record.measurements import Category, Phase, StepRecord
from ..record.watch import WatchedRun
from .source import dotted_name
from ..sites import Site, relative_where

if TYPE_CHECKING:
    from .context import Context

__all__ = [
    "PERIODIC_TARGET_SHARE",
    "SUGGESTED_SHARE",
    "PeriodicRow",
    "periodic_kind",
    "periodic_site",
    "suggested_every",
    "periodic_table",
    "watched_periodic",
    "all_periodic",
    "watch_message",
]


# What recurring work may cost of training time before the doctor calls it out, and aims at.
PERIODIC_TARGET_SHARE = 0.05
# The cadence a fix suggests aims at half of it: the work found again after the fix (the watch after the window
# sees it at any period) must stay under the threshold through a run's noise, not sit on its edge.
SUGGESTED_SHARE = PERIODIC_TARGET_SHARE / 2
_PERIODIC_KINDS: dict[Phase, str] = {"eval": "validation", "eval_grad": "validation", "save": "checkpoint"}
_PERIODIC_SITES = {"validation": ("eval_forward", "eval_grad_forward"), "checkpoint": ("save",)}


@dataclass(frozen=True)
class PeriodicRow:
    """One piece of recurring work as the report shows it: what it costs amortised, a cadence under 5%."""

    kind: str  # validation, sampling, checkpoint, or work between steps
    category: Category
    every: int | None  # steps between occurrences; None: seen once (the period is unknown)
    steps: list[int]  # the steps it ran in
    cost_ms: float  # each occurrence, over an ordinary step
    share: float | None  # of training time, amortised over its period; None: no period
    where: str | None
    site: Site | None  # the line ``where`` names, for the rules and the fixes (not in the JSON)
    suggested_every: int | None
    target_share: float = PERIODIC_TARGET_SHARE
    # Work the watch after the window found: how its period was known ("gaps" or "code") and a note for the finding.
    found_by: Literal["watch"] | None = None
    period_from: str | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        # The fields, in their order, are the JSON's keys (renaming one changes the report), less the line (``where``
        # says it) and, on the window's own rows, the watch's three, which those rows have never carried.
        left_out = {"site"} if self.found_by is not None else {"site", "found_by", "period_from", "note"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in left_out}


def periodic_kind(ctx: Context, periodic: Periodic) -> str:
    """What the spikes were: validation, a checkpoint, or a DataLoader starting a new epoch."""
    spent: dict[str, float] = defaultdict(float)
    for step in _records(ctx):
        if step.index in periodic.steps:
            for phase, seconds in step.phases.items():
                if phase in _PERIODIC_KINDS:
                    spent[_PERIODIC_KINDS[phase]] += seconds
    return max(spent, key=lambda k: spent[k]) if spent else "work between steps"


def _records(ctx: Context) -> list[StepRecord]:
    """The recorded steps, and the occurrences the watch after the window kept."""
    watched = ctx.recording.watched if ctx.recording is not None else None
    return list(ctx.step_records) + (list(watched.spikes) if watched is not None else [])


def watched_periodic(ctx: Context) -> list[Periodic]:
    """Recurring work the watch after the window found (the breakdown amortised it into its step)."""
    return [p for p in ctx.breakdown.periodic if p.watched]


def all_periodic(ctx: Context) -> list[Periodic]:
    """The window's recurring work and the watch's; a window row seen once gives way to a watched one."""
    watched = watched_periodic(ctx)
    return [
        p for p in ctx.breakdown.periodic if p.watched or p.every or not any(w.category == p.category for w in watched)
    ]


def periodic_site(ctx: Context, kind: str, periodic: Periodic) -> Site | None:
    """The user's line where the recurring work ran most (its validation forward, its torch.save)."""
    best, best_n = None, 0
    for (tally_kind, site), tally in ctx.tallies.items():
        if tally_kind in _PERIODIC_SITES.get(kind, ()):
            n = sum(tally.by_step[i][0] for i in periodic.steps if i in tally.by_step)
            if n > best_n:
                best, best_n = site, n
    return best


_SAMPLERS = ("generate", "sample")


def _samples(ctx: Context, site: Site) -> bool:
    """Whether the eval forwards at ``site`` generate samples: the line calls ``.generate(...)``/``.sample(...)``,
    or it sits in a function of that name. Sampling text is no validation (no inference_mode, no val loader)."""
    index = ctx.sources.get(site.file)
    if index is None:
        return False
    for node in ast.walk(index.tree):
        if isinstance(node, ast.Call) and node.lineno <= site.line <= (node.end_lineno or node.lineno):
            if dotted_name(node.func).rsplit(".", 1)[-1].startswith(_SAMPLERS):
                return True
            function = index.enclosing_function(node)
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and function.name.startswith(_SAMPLERS):
                return True
    return False


def suggested_every(cost_s: float, base_step_s: float, every: int, target: float = PERIODIC_TARGET_SHARE) -> int:
    """The smallest cadence (a multiple of the current one) at which the work costs under ``target``."""
    if base_step_s <= 0:
        return every
    need = cost_s * (1 - target) / (target * base_step_s)
    return max(every, every * max(1, -(-int(need) // every)))


def periodic_table(ctx: Context) -> list[PeriodicRow]:
    """The report's rows: each recurring piece of work, what it costs amortised, and a cadence under 5%."""
    rows = []
    step_s = ctx.step_s
    watched = ctx.recording.watched if ctx.recording is not None else None
    for p in all_periodic(ctx):
        kind = periodic_kind(ctx, p)
        site = periodic_site(ctx, kind, p) or p.site  # else the loop's `% N` test its occurrences fell on
        if kind == "validation" and site is not None and _samples(ctx, site):
            kind = "sampling"
        # An evaluation's first calls compile its graph (the grad-mode recompile): paid once, the compile rules'
        # finding, not a cost each occurrence pays again.
        compiling = _compiling_in(ctx, p.steps)
        cost_s = max(0.0, p.cost_s - compiling)
        amortised = cost_s / p.every if p.every else 0.0
        share = amortised / step_s if step_s and p.every else None
        base_step = max(step_s - p.amortised_s, 1e-9)  # the breakdown amortised all of it into the step
        row = PeriodicRow(
            kind=kind,
            category=p.category,
            every=p.every,
            steps=p.steps,
            cost_ms=round(cost_s * 1e3, 3),
            share=round(share, 4) if share is not None else None,
            where=ctx.where(site),
            site=site,
            suggested_every=suggested_every(cost_s, base_step, p.every, SUGGESTED_SHARE) if p.every else None,
        )
        notes = [_watch_note(p, watched)] if p.watched and watched is not None else []
        if compiling >= 0.001:
            notes.append(
                f"torch.compile compiled in these steps, {compiling * 1e3:.0f} ms an occurrence on average (torch's "
                "count, the compile findings'): left out of its cost, which a run pays once."
            )
        if p.watched and watched is not None:
            row = replace(row, found_by="watch", period_from=p.period_from)
        rows.append(replace(row, note=" ".join(notes)) if notes else row)
    return rows


def _compiling_in(ctx: Context, steps: list[int]) -> float:
    """The seconds torch.compile spent compiling in ``steps`` (by the start of each compile), a step's mean."""
    facts = ctx.compiled
    if facts is None or not facts.spans or not steps:
        return 0.0
    wanted = set(steps)
    records = [r for r in _records(ctx) if r.index in wanted]
    seconds = sum(span.seconds for span in facts.spans for r in records if r.start <= span.start < r.end)
    return seconds / len(steps)


def _watch_note(p: Periodic, watched: WatchedRun) -> str:
    """How work beyond the window was found, for the finding."""
    period = (
        "its period read from the gaps between occurrences"
        if p.period_from == "gaps"
        else "its period read from the loop's `% N` test, one occurrence timed"
    )
    return (
        f"Found by watching the step clock after the measured window: steps {watched.first}-{watched.last} "
        f"({watched.seconds:.1f} s), {len(p.steps)} occurrence(s) at step(s) "
        f"{', '.join(str(i) for i in p.steps[:4])}; {period}."
    )


def _period(cadence: Cadence) -> str:
    """``100 steps``; an outer loop's ``100 iterations of the loop around the step (about 1100 steps)``."""
    if not cadence.outer:
        return f"{cadence.every} steps"
    times = round(cadence.every / cadence.per_count)
    return f"{times} iterations of the loop around the step (about {cadence.every} steps)"


def watch_message(ctx: Context) -> str | None:
    """What the watch after the window did, for the report's messages (None: there was none)."""
    watched = ctx.recording.watched if ctx.recording is not None else None
    if watched is None:
        return None
    cadences = ", ".join(
        sorted(
            {f"every {_period(c)} ({relative_where(c.site.file, ctx.base)}:{c.site.line})" for c in watched.cadences}
        )
    )
    why = {
        "periods": "two periods of its longest cadence",
        "occurrences": "three occurrences of work over the ordinary step",
        "budget": f"its {watched.budget_s:g} s budget",
        "script": "the script's end",
    }.get(watched.ended, watched.ended)
    found = watched_periodic(ctx)
    return (
        f"After the window, the step clock was watched for {watched.seconds:.1f} s (steps {watched.first}-"
        f"{watched.last}, until {why}) for the work the loop runs {cadences}: "
        + (f"{sum(len(p.steps) for p in found)} occurrence(s) found." if found else _nothing_new(watched))
    )


def _nothing_new(watched: WatchedRun) -> str:
    if not watched.spikes:
        return "none ran over the ordinary step."
    return (
        f"{len(watched.spikes)} step(s) ran over the ordinary one, none of them recurring work beyond what the "
        "window found."
    )
