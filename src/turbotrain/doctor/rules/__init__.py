"""The doctor's rules: each reads a :class:`~turbotrain.doctor.analysis.context.Context` and yields findings.

Three sources, one module each: ``runtime`` (the measured breakdown and per-site events),
``live`` (the model, loader, optimizer and hardware objects the script built) and ``static``
(the script's source). Rule ids are the catalogue in docs/doctor.md; :data:`RULE_IDS` lists them all:
the ones a speed-up declares next to its registry entry (``Speedup.doctor_rules``), read from the
registry, and :data:`HABIT_RULES`, the habits no Plan switch answers.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable

from ..findings import SEVERITIES, Finding
from .registry import HABIT_RULES, RULE_IDS, RULES, rule

if TYPE_CHECKING:
    from ..analysis.context import Context

__all__ = ["rule", "evaluate", "RULES", "RULE_IDS", "HABIT_RULES"]

log = logging.getLogger("turbotrain")


def _load() -> None:
    # Importing them registers their rules.
    from . import attribution, batch_building, live, ranks, recorded, static, threads  # noqa: F401 - registers them


def _merge(findings: list[Finding]) -> list[Finding]:
    """One finding per (rule, line): a runtime finding absorbs a static one about the same line."""
    by_key: dict[tuple[str, object], Finding] = {}
    rank = {"runtime": 0, "live": 1, "static": 2}
    for f in findings:
        key = (f.rule, (f.site.file, f.site.line) if f.site else f.where)
        kept = by_key.get(key)
        if kept is None or (rank[f.source], SEVERITIES.index(f.severity)) < (
            rank[kept.source],
            SEVERITIES.index(kept.severity),
        ):
            by_key[key] = f
    merged = list(by_key.values())
    # A static guess adds nothing where the run measured the same rule in the same function.
    measured = {(f.rule, f.site.file, f.site.function) for f in merged if f.source != "static" and f.site}
    return [
        f
        for f in merged
        if not (f.source == "static" and f.site and (f.rule, f.site.file, f.site.function) in measured)
    ]


def evaluate(
    ctx: Context, only: Iterable[str] | None = None, failed: list[tuple[str, str]] | None = None
) -> list[Finding]:
    """Every rule's findings for ``ctx``, merged; a rule that crashes is skipped, and added to ``failed`` as
    (rule id, error) for the report to say so."""
    _load()
    wanted = set(only) if only else None
    found: list[Finding] = []
    for rule_id, source, fn in RULES:
        if wanted is not None and rule_id not in wanted:
            continue
        try:
            for finding in fn(ctx) or ():
                finding.source = source
                found.append(finding)
        except Exception as exc:  # noqa: BLE001 - one broken rule must not cost the whole report
            log.warning("turbotrain doctor: rule %s failed: %s: %s", rule_id, type(exc).__name__, exc)
            if failed is not None:
                failed.append((rule_id, f"{type(exc).__name__}: {exc}"))
    from .attribution import explained
    from .ranks import absorbed_by_straggler

    findings = order(absorbed_by_straggler(explained(_merge([f for f in found if _confirmed(ctx, f)]))))
    framework = ctx.recording.driver if ctx.recording is not None and ctx.recording.driver else "pytorch"
    for f in findings:  # each fix is shown in the framework whose loop ran (record/drivers.py)
        f.fix.framework = framework
    return findings


def _confirmed(ctx: Context, finding: Finding) -> bool:
    """A static finding on a line the run could have executed: kept only if its function ran; when the run
    saw it never run, it stays at ``low`` and says so."""
    if finding.source != "static" or finding.site is None:
        return True
    ran = ctx.function_ran(finding.site)
    if ran is False:
        finding.cap(
            "low",
            "This line did not run while the doctor watched (the warm-up and profiled steps); "
            "it matters only if this code runs during training.",
        )
        finding.evidence["ran"] = False
    return True


def order(findings: list[Finding]) -> list[Finding]:
    """By severity, then by what the fix buys."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), -(f.est_speedup or 1.0), f.rule))
