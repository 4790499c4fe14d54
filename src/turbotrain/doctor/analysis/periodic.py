"""Recurring work between steps (validation, checkpoints), as the report's rows: its kind, its line, what it
costs amortised over its period, and the cadence at which it would cost under 5% of training time.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..record.recurring import Periodic
from .context import Context
from ..sites import Site

__all__ = ["PERIODIC_TARGET_SHARE", "periodic_kind", "periodic_site", "suggested_every", "periodic_table"]


# What recurring work may cost of training time before the doctor calls it out, and aims at.
PERIODIC_TARGET_SHARE = 0.05
_PERIODIC_KINDS = {"eval": "validation", "eval_grad": "validation", "save": "checkpoint"}
_PERIODIC_SITES = {"validation": ("eval_forward", "eval_grad_forward"), "checkpoint": ("save",)}


def periodic_kind(ctx: Context, periodic: Periodic) -> str:
    """What the spikes were: validation, a checkpoint, or a DataLoader starting a new epoch."""
    spent: dict[str, float] = defaultdict(float)
    for step in ctx.step_records:
        if step.index in periodic.steps:
            for phase, seconds in step.phases.items():
                if phase in _PERIODIC_KINDS:
                    spent[_PERIODIC_KINDS[phase]] += seconds
    return max(spent, key=lambda k: spent[k]) if spent else "work between steps"


def periodic_site(ctx: Context, kind: str, periodic: Periodic) -> Site | None:
    """The user's line where the recurring work ran most (its validation forward, its torch.save)."""
    best, best_n = None, 0
    for (tally_kind, site), tally in ctx.tallies.items():
        if tally_kind in _PERIODIC_SITES.get(kind, ()):
            n = sum(tally.by_step[i][0] for i in periodic.steps if i in tally.by_step)
            if n > best_n:
                best, best_n = site, n
    return best


def suggested_every(cost_s: float, base_step_s: float, every: int, target: float = PERIODIC_TARGET_SHARE) -> int:
    """The smallest cadence (a multiple of the current one) at which the work costs under ``target``."""
    if base_step_s <= 0:
        return every
    need = cost_s * (1 - target) / (target * base_step_s)
    return max(every, every * max(1, -(-int(need) // every)))


def periodic_table(ctx: Context) -> list[dict[str, Any]]:
    """The report's rows: each recurring piece of work, what it costs amortised, and a cadence under 5%."""
    rows = []
    step_s = ctx.step_s
    for p in ctx.breakdown.periodic:
        kind = periodic_kind(ctx, p)
        site = periodic_site(ctx, kind, p)
        share = p.amortised_s / step_s if step_s and p.every else None
        base_step = max(step_s - p.amortised_s, 1e-9)
        rows.append({"kind": kind, "category": p.category, "every": p.every, "steps": p.steps,
                     "cost_ms": round(p.cost_s * 1e3, 3), "share": round(share, 4) if share is not None else None,
                     "where": ctx.where(site), "site": site,
                     "suggested_every": suggested_every(p.cost_s, base_step, p.every) if p.every else None,
                     "target_share": PERIODIC_TARGET_SHARE})
    return rows
