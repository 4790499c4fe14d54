"""From findings to edit requests: each finding's rule plans its edit (``Rule.edit``, in the rule's own module);
this module places it (file, line, inside the script's folder) and notes the what-if's doubts about it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..findings import Finding
from ..rules import all_rules
from ..sites import relative_where
from .model import EXACT, ByHand, EditRequest
from ..report.fix_results import FixResult

if TYPE_CHECKING:
    from ..analysis.context import Context
    from ..edits import EditSpec

__all__ = ["plan_fixes", "fixable_rules", "check_rules"]


def fixable_rules() -> frozenset[str]:
    """The rules whose fix is an edit (a rule declares its edit planner: rules/rule.py)."""
    return frozenset(r.id for r in all_rules() if r.edit is not None)


def check_rules(rules: list[str] | tuple[str, ...]) -> None:
    """Every rule named is one whose fix is an edit; the error names the rest and lists the fixable ones."""
    from ...config import ConfigError

    fixable = fixable_rules()
    unknown = [r for r in rules if r not in fixable]
    if unknown:
        raise ConfigError(
            f"doctor --fix-only: {', '.join(unknown)} is not a rule whose fix the doctor can edit; "
            f"fixable rules: {', '.join(sorted(fixable))}"
        )


def _inside(path: str, base: str) -> bool:
    return os.path.commonpath([os.path.realpath(path), os.path.realpath(base)]) == os.path.realpath(base)


def _request(f: Finding, spec: EditSpec, base: str) -> EditRequest:
    """``spec`` (and what it makes instead) as a request on a file under ``base``; :class:`ByHand` outside it."""
    path = spec.file
    if not path:
        assert f.site is not None  # a rule that edits without a site names the file
        path = f.site.file
    if not path or not _inside(path, base):
        raise ByHand(f"{path} is outside the script's folder; the patch edits only files under it")
    line = spec.line if spec.line is not None else (f.site.line if f.site else 0)
    return EditRequest(
        rule=f.rule,
        kind=spec.kind,
        file=os.path.realpath(path),
        line=line,
        where=f"{relative_where(path, base)}:{line}" if line else relative_where(path, base),
        label=spec.label,
        numerics=spec.numerics,
        params=dict(spec.params),
        lines=spec.lines,
        predicted=f.est_speedup,
        gain_share=f.gain_share,
        category=f.category,
        purpose=spec.purpose,
        instead=_request(f, spec.instead, base) if spec.instead is not None else None,
    )


def plan_fixes(
    ctx: Context, findings: list[Finding], base: str, rules: tuple[str, ...] | None = None
) -> list[FixResult]:
    """One :class:`FixResult` per finding whose rule has an edit kind (of ``rules``, when given): with its
    request, or why it is by hand."""
    if rules is not None:
        check_rules(rules)
    out = []
    planners = {r.id: r for r in all_rules() if r.edit is not None}
    for f in findings:
        rule = planners.get(f.rule)
        if rules is not None and f.rule not in rules:
            continue
        if rule is None or rule.edit is None or (f.site is None and not rule.edits_without_site):
            continue
        where = f.where or (f.site.where(base) if f.site else "")
        result = FixResult(rule=f.rule, where=where, label=f.fix.pytorch, predicted=f.est_speedup)
        out.append(result)
        try:
            spec = rule.edit(ctx, f)
            result.request = _request(f, spec, base)
            result.label, result.numerics, result.purpose = (
                result.request.label,
                result.request.numerics,
                result.request.purpose,
            )
        except ByHand as exc:
            result.by_hand = str(exc)
            continue
        if result.purpose == "memory":
            # It trades time for memory: its time is no doubt (the rule's edit checked the bytes it saves). Where the
            # step fits with room to spare (the rule says so) that trade only costs time, unless asked for by name.
            if not spec.needed and rules is None:
                result.dropped = (
                    "the step fits with room to spare, so the memory it saves would cost time for nothing; "
                    f"--fix-only {f.rule} writes it"
                )
            continue
        verdict = f.what_if.verdict if f.what_if is not None else None
        ratio = (f.what_if.ratio if f.what_if is not None else None) or 0.0
        if verdict == "slower":
            result.doubt = f"the what-if measured it slower here (x{ratio:.2f})"
        elif verdict is not None and verdict != "faster" and result.numerics != EXACT:
            # Changing numerics for no measured gain is not worth it (the what-ifs' own rule, doctor.whatif).
            result.doubt = f"the what-if measured no gain for this change of numerics (x{ratio:.2f}, {verdict})"
    return out
