"""The doctor's rules: one module per rule, ``rules/<topic>/<rule_id>.py`` (:mod:`.rule` says what a rule
declares, and refuses one that leaves a part out); :func:`evaluate` runs them all over a
:class:`~turbotrain.doctor.analysis.context.Context` and returns their findings, merged and in order.

The topics: ``data`` (feeding the step), ``step`` (the step itself), ``loop`` (the loop around it), ``job``
(a multi-process job's ranks), ``machine`` (cores and threads), ``compile`` and ``memory``. What several rules
share is in ``common``; what each says of itself (its :class:`~.rule.Card`) is ``turbotrain doctor --rules``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Iterable

from ..findings import SEVERITIES, Finding, framework_named, one_line
from .rule import Rule, all_rules, by_id, habit_rules, rule_ids

if TYPE_CHECKING:
    from ..analysis.context import Context

__all__ = ["evaluate", "order", "Rule", "all_rules", "by_id", "rule_ids", "habit_rules"]

log = logging.getLogger("turbotrain")


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
    wanted = set(only) if only else None
    found: list[Finding] = []
    for rule in all_rules():
        if wanted is not None and rule.id not in wanted:
            continue
        for detect in rule.detect:
            try:
                for finding in detect.fn(ctx) or ():
                    finding.source = detect.source
                    found.append(finding)
            except Exception as exc:  # noqa: BLE001 - one broken rule must not cost the whole report
                log.warning("turbotrain doctor: rule %s failed: %s", rule.id, one_line(exc))
                if failed is not None:
                    failed.append((rule.id, one_line(exc)))
    from .job.straggler import absorbed_by_straggler
    from .loop.unattributed_time import explained

    findings = order(absorbed_by_straggler(explained(_merge([f for f in found if _confirmed(ctx, f)]))))
    framework = framework_named(ctx.recording.driver if ctx.recording is not None else None)
    for f in findings:  # each fix is shown in the framework whose loop ran (record/drivers.py)
        f.fix = dataclasses.replace(f.fix, framework=framework)
    return findings


def _confirmed(ctx: Context, finding: Finding) -> bool:
    """A static finding on a line the run could have executed: kept only if its function ran; when the run
    saw it never run, it stays at ``low`` and says so."""
    if finding.source != "static" or finding.site is None:
        return True
    finding.ran = ctx.function_ran(finding.site)
    if finding.ran is False:
        finding.cap(
            "low",
            "This line did not run while the doctor watched (the warm-up and profiled steps); "
            "it matters only if this code runs during training.",
        )
    return True


def order(findings: list[Finding]) -> list[Finding]:
    """By severity, then by what the fix buys."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), -(f.est_speedup or 1.0), f.rule))
