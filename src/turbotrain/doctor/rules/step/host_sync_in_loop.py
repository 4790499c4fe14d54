"""`host-sync-in-loop`: a sync per step at a line of your code.

Reads: run.
Applies to: a GPU (low on a CPU).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from ...findings import Evidence, Finding, Fix
from ...sites import Site
from ..common import ms
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


_SYNC_NAMES = {
    "item": ".item()",
    "tolist": ".tolist()",
    "numpy": ".numpy()",
    "cpu": ".cpu()",
    "nonzero": ".nonzero()",
    "bool": "bool()/if on a tensor",
    "float": "float(tensor)",
    "int": "int(tensor)",
    "repr": "print/str of a tensor",
    "format": "an f-string of a tensor",
    "to_cpu": ".to('cpu')",
    "cuda": "a synchronizing CUDA call",
}


@dataclass
class _Syncs:
    """The host syncs at one line: which calls, how many per step, their seconds per step."""

    kinds: set[str] = field(default_factory=set)
    per_step: float = 0.0
    seconds: float = 0.0


@dataclass(frozen=True)
class HostSyncEvidence(Evidence):
    per_step: float
    kinds: tuple[str, ...]  # the calls that synced ("item", "repr", ...), sorted
    ms_per_step: float


def host_sync(ctx: Context) -> Iterator[Finding]:
    by_site: defaultdict[Site, _Syncs] = defaultdict(_Syncs)
    for stat in ctx.ran_sites("sync:"):
        entry = by_site[stat.site]
        entry.kinds.add(stat.kind.split(":", 1)[1])
        entry.per_step = max(entry.per_step, stat.per_step)
        entry.seconds += stat.seconds_per_step
    if not by_site:
        return
    total_sync = sum(e.seconds for e in by_site.values()) or 1e-12
    sync_share = ctx.share("host_sync")
    ranked = sorted(by_site.items(), key=lambda kv: (-kv[1].seconds, -kv[1].per_step))
    for site, entry in ranked[:6]:
        names = ", ".join(sorted(_SYNC_NAMES.get(k, k) for k in entry.kinds))
        share = sync_share * entry.seconds / total_sync
        f = Finding(
            "host-sync-in-loop",
            site=site,
            category="host_sync",
            message=(
                f"{names} here makes the host wait for the device {entry.per_step:g}x per step "
                f"({ms(entry.seconds)} per step, {share:.1%} of step time)."
            ),
            fix=Fix(
                "Keep values on the device inside the step (e.g. running_loss += loss.detach()) and read them "
                "with .item() only every N steps; no print/f-string/if on tensors in the step.",
                lightning="self.log(name, value) (logged lazily) with Trainer(log_every_n_steps=N)",
                accelerate="accelerator.gather(...) and .item() only on logging steps",
                hf_trainer="TrainingArguments(logging_steps=N): the Trainer reads the loss on logging steps",
            ),
            evidence=HostSyncEvidence(
                per_step=entry.per_step,
                kinds=tuple(sorted(entry.kinds)),
                ms_per_step=round(entry.seconds * 1e3, 4),
            ),
        )
        f.set_gain(share, measured=True)
        if not ctx.on_gpu:
            f.note = (
                "On this CPU run the call itself is cheap; on a GPU each one stalls the host until every "
                "queued kernel has finished, so the host can no longer run ahead."
            )
        yield f


RULE = register(Rule("host-sync-in-loop", detect=(Detect("runtime", host_sync),)))
