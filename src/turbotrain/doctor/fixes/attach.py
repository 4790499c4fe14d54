"""``doctor --fix [--verify]`` end to end: plan the edits, diff them, verify them, write the patch.

Order of work: every fixable finding becomes an edit request (:mod:`.choose`); each is made alone on
the original to get its own diff, and must compile (:mod:`.diff`); with ``verify``, each is timed
alone against the original while the budget allows, then the ones kept together (:mod:`.verify`);
a fix that verifies slower, or breaks the script, is dropped (a fix for memory: one that saves none, whatever its
time, which the report states); the patch of what is left is written
with a header that also lists what is by hand and what was left out, and why.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from ...measure import FASTER, SLOWER
from .losses import weakest
from ..report.fix_results import FixReport, FixResult, Verification
from ..report.fix_section import fix_line, peak_text
from .diff import PatchError, combine, make_diffs, render_patch, write_patch
from .choose import plan_fixes
from .verify import Verifier, VerifyError, VerifyOptions

if TYPE_CHECKING:
    from ..analysis.context import Context
    from ..findings import Finding
    from ..report.model import Report

__all__ = ["attach_fixes", "predicted_together"]

_MAX_VERIFY_STEPS = 2000
MEMORY_SAVED = 0.02  # a memory fix is kept when the patched peak is this share of the original's lower, or more


def predicted_together(fixes: list[FixResult]) -> float | None:
    """The fixes' predicted speed-ups combined through the share of the step each saves: shares of different
    categories add up; within one category (two loader fixes on the same data wait) only the largest counts."""
    by_category: dict[str, float] = {}
    for i, f in enumerate(fixes):
        if f.predicted:
            key = (f.request.category if f.request else None) or f"fix {i}"
            share = 1.0 - 1.0 / f.predicted  # < 0 for a fix predicted slower (one made for memory)
            by_category[key] = max(by_category.get(key, share), share)
    if not by_category:
        return None
    return round(1.0 / (1.0 - min(0.95, max(-10.0, sum(by_category.values())))), 3)


def _periods(fixes: list[FixResult]) -> list[int]:
    """The cadences ``fixes`` set (validation, checkpoints every N steps) and the ones they replace."""
    cadences = [
        f.request.params for f in fixes if f.request is not None and f.request.kind in ("cadence", "save_every")
    ]
    return sorted({every for params in cadences for every in (params.get("new_every"), params.get("every")) if every})


def _steps(fixes: list[FixResult], steps: int) -> int:
    """Steps covering whole periods of every cadence in ``fixes`` (and of the ones they replace)."""
    periods = _periods(fixes)
    if not periods:
        return steps
    period = math.lcm(*periods)
    if period > _MAX_VERIFY_STEPS:
        period = max(periods)
    return min(max(period, -(-steps // period) * period), max(_MAX_VERIFY_STEPS, steps))


@dataclass(frozen=True)
class _VerifyRun:
    """What every comparison of one ``--verify`` shares: the runner, the sources before any edit, the script's folder,
    the steps to time and what those cost the original (``run_s``)."""

    verifier: Verifier
    originals: dict[str, str]
    base: str
    steps: int
    run_s: float

    def affords(self, runs: int) -> bool:
        return self.verifier.affords(runs, self.run_s)

    def check(self, results: list[FixResult]) -> Verification:
        """``results`` patched together, timed against the original."""
        texts = combine(results, self.originals, self.base)
        changed = {path: text for path, text in texts.items() if text != self.originals[path]}
        folder = self.verifier.variant(changed)
        return self.verifier.compare(
            folder,
            _steps(results, self.steps),
            weakest([r.numerics for r in results]),
            periodic=bool(_periods(results)),
        )


def _by_rule(results: list[FixResult]) -> list[list[FixResult]]:
    """The fixes grouped by rule (one rule at two lines is one fix to verify), the biggest promise first."""
    groups: dict[str, list[FixResult]] = {}
    for result in results:
        groups.setdefault(result.rule, []).append(result)
    return sorted(groups.values(), key=lambda g: -max(r.predicted or 1.0 for r in g))


def _verify(fix_report: FixReport, results: list[FixResult], run: _VerifyRun) -> None:
    candidates = [r for r in results if r.in_patch]
    groups = _by_rule(candidates)
    if len(groups) > 1:
        for members in groups:
            if not run.affords(2):
                fix_report.messages.append(
                    f"The verify budget ({run.verifier.options.budget_s:g} s) left no time to verify {members[0].rule} "
                    "alone; it was verified only with the others."
                )
                continue
            check = run.check(members)
            for result in members:
                result.verification = check
                _judge_alone(result)
        for result in candidates:
            if result.doubt and result.verification is None:
                result.dropped = f"{result.doubt}, and the budget left no time to verify it alone"
    kept = [r for r in candidates if r.in_patch]
    if not kept:
        return
    alone = len({r.rule for r in kept}) == 1
    if alone and kept[0].verification is not None:
        fix_report.together = kept[0].verification  # the same comparison: not run twice
        return
    together = run.check(kept)
    fix_report.together = together
    if alone:
        for result in kept:
            result.verification = together
            _judge_alone(result)
    elif together.error:
        for result in kept:
            result.dropped = f"the fixes together broke the script ({together.error})"
        fix_report.messages.append(f"With all fixes together, {together.error}; the patch holds none of them.")
    elif together.verdict == SLOWER:
        if _time_fixes_hold(fix_report, kept, together, run):
            return
        # --verify promises a patch measured not to slow the script: only fixes verified faster alone stay.
        unproven = _unproven(kept)
        for result in unproven:
            result.dropped = f"the fixes together verified slower (x{together.speedup:.2f}), this one not faster alone"
        fix_report.messages.append(
            f"With all fixes together the script ran x{together.speedup:.2f} (slower): the patch holds only fixes "
            f"verified faster alone ({len(kept) - len(unproven)} of {len(kept)}); a larger --verify-budget times each "
            "alone."
        )
    else:
        _keep_the_better_alone(fix_report, kept, together, run)


def _keep_the_better_alone(
    fix_report: FixReport, kept: list[FixResult], together: Verification, run: _VerifyRun
) -> None:
    """Where one fix verified alone beat the fixes together in every round, the others cost what it buys: only the
    fixes verified faster alone stay (those kept for memory too)."""
    unproven = _unproven(kept)
    alone = [r.verification for r in kept if r not in unproven and r.verification is not None]
    best = max((v for v in alone if v.verdict == FASTER and v.ratios), key=lambda v: v.speedup or 0.0, default=None)
    if best is None or not together.ratios or min(best.ratios) <= max(together.ratios) or not unproven:
        return
    rule = next(r.rule for r in kept if r.verification is best)
    for result in unproven:
        result.dropped = (
            f"the fixes together ran x{together.speedup:.2f}, {rule} alone x{best.speedup:.2f} in "
            "every round above them; this one was not verified faster alone"
        )
    stay = [r for r in kept if r not in unproven]
    fix_report.messages.append(
        f"With all fixes together the script ran x{together.speedup:.2f}, slower than {rule} alone "
        f"(x{best.speedup:.2f}, every round): the patch holds only fixes verified faster alone "
        f"({len(stay)} of {len(kept)}); a larger --verify-budget times each alone."
    )
    if {r.rule for r in stay} == {rule}:
        fix_report.together = best
    elif run.affords(2):
        fix_report.together = run.check(stay)


def _unproven(kept: list[FixResult]) -> list[FixResult]:
    """The fixes not verified faster alone, less those kept for the memory they save."""
    return [r for r in kept if (r.verification is None or r.verification.verdict != FASTER) and not _kept_for_memory(r)]


def _time_fixes_hold(fix_report: FixReport, kept: list[FixResult], together: Verification, run: _VerifyRun) -> bool:
    """Where the patch holds fixes for memory (slower by design) beside fixes for time: the time fixes together,
    without them. True, and said, where those are not slower: none of them goes for the memory fixes' price."""
    memory = [r for r in kept if r.purpose == "memory"]
    timed = [r for r in kept if r.purpose != "memory"]
    if not memory or not timed or not run.affords(2):
        return False
    check = run.check(timed)
    if check.error or check.verdict == SLOWER:
        return False
    fix_report.messages.append(
        f"With all fixes together the script ran x{together.speedup:.2f} (slower): the price of "
        f"{', '.join(sorted({r.rule for r in memory}))}, which trades time for memory; the fixes for time together, "
        f"without it, ran x{check.speedup:.2f} ({check.verdict}), and stay."
    )
    return True


def saves_memory(check: Verification | None) -> bool:
    """The patched script's memory peak is lower than the original's by ``MEMORY_SAVED`` of it or more."""
    if check is not None and check.original_out_of_memory and not check.error:
        return True  # the original ran out of memory and the patched script ran: it fits now
    peak = check.peak_memory if check is not None else None
    return peak is not None and peak["patched_bytes"] <= (1 - MEMORY_SAVED) * peak["original_bytes"]


def _kept_for_memory(result: FixResult) -> bool:
    """A fix made for memory that verified to save it: kept whatever its time (a fix for time that happens to
    lower the peak is still judged by its time)."""
    return result.purpose == "memory" and saves_memory(result.verification)


def _judge_alone(result: FixResult) -> None:
    check = result.verification
    assert check is not None  # the callers set it just before
    if check.error:
        result.dropped = f"verifying it: {check.error}"
    elif result.purpose == "memory":
        if not saves_memory(check):
            said = f" ({peak_text(check.peak_memory)})" if check.peak_memory else ""
            result.dropped = f"verified to save no memory{said}"
    elif check.verdict == SLOWER:
        result.dropped = f"verified slower (x{check.speedup:.2f} over {len(check.ratios)} round(s))"
    elif result.doubt and check.verdict != FASTER:
        result.dropped = (
            f"{result.doubt}, and verifying it showed no gain either (x{check.speedup:.2f}, {check.verdict})"
        )


def _header(report: Any, fix_report: FixReport, patch_name: str, base: str, verified: bool) -> list[str]:
    kept, fixes = fix_report.kept, fix_report.fixes
    by_hand = [f for f in fixes if f.by_hand]
    left_out = [f for f in fixes if f.edit and f.dropped]
    script = os.path.relpath(report.run.script, base) if report.run else report.script
    lines = [
        f"turbotrain doctor --fix{' --verify' if verified else ''}: {script} {' '.join(report.argv)}".rstrip(),
        f"Apply in the script's folder ({base}): git apply {patch_name}",
        f"{len(kept)} edit(s), {len(by_hand)} by hand, {len(left_out)} left out.",
    ]
    if fix_report.predicted_together or fix_report.together:
        lines.append("Together: " + fix_line(fix_report.predicted_together, fix_report.together))
    lines.append("")
    lines += [f"edit      {f.rule}  {_edited_at(f)}  {f.label}  {fix_line(f.predicted, f.verification)}" for f in kept]
    lines += [f"by hand   {f.rule}  {f.where}  {f.by_hand}" for f in by_hand]
    lines += [f"left out  {f.rule}  {_edited_at(f)}  {f.label}: {f.dropped}" for f in left_out]
    return [" ".join(line.split("\n")) for line in lines]


def _edited_at(fix: FixResult) -> str:
    """The line the patch changes, and the finding's line where that differs (an out-of-memory error is found where
    the allocation failed, and its micro-batches are written into the training loop)."""
    edited = fix.request.where if fix.request is not None else fix.where
    return edited if edited == fix.where else f"{edited} (found at {fix.where})"


def _steps_to_verify(ctx: Context, asked: int) -> int:
    """The steps each verify run measures: the recording's own where long steps cut its window."""
    window = ctx.recording.window if ctx.recording is not None else None
    if window is not None and window.cut_for_step_s is not None and window.measure is not None:
        return min(asked, window.measure)
    return asked


def _timed_window(ctx: Context, warmup: int) -> tuple[int, bool]:
    """How --verify's runs time what torch.compile did in the recorded run: their warm-up (at least ``warmup``
    steps, and past the step in which the last compile ended: first compiles, recompiles and the one that hit the
    recompile limit are seconds paid once, which the original's steps would otherwise be timed with), and whether
    a run counts as its mean step (compiled code that hit the limit runs some inputs eagerly, the others compiled:
    a median would be one kind's)."""
    recording = ctx.recording
    facts = recording.compiled if recording is not None else None
    if recording is None or facts is None:
        return warmup, False
    mixed = facts.fell_back > 0
    if not facts.spans:
        return warmup, mixed
    last = max(s.start + s.seconds for s in facts.spans)
    index = next((s.index for s in recording.steps if s.end >= last), None)
    return (warmup if index is None else max(warmup, index + 1)), mixed


def attach_fixes(
    report: Report,
    ctx: Context,
    findings: list[Finding],
    options: Any,
    script_path: str,
    make_verifier: Callable[[VerifyOptions], Verifier] | None = None,
) -> FixReport:
    """Plan, diff, (verify,) and write the patch of ``report``'s findings; the outcome as a :class:`FixReport`.
    ``make_verifier``: how the original and the patched script are run (default: the script alone, in a process
    of its own; a multi-process job passes its launcher's)."""
    base = os.path.dirname(script_path)
    fix_report = FixReport()
    results = plan_fixes(ctx, findings, base, options.fix_rules)
    fix_report.fixes = results
    originals = make_diffs(results, base)
    if options.verify and any(r.in_patch for r in results) and report.run is not None:
        warmup, mean_step = _timed_window(ctx, options.warmup)
        steps = _steps_to_verify(ctx, options.steps)
        verify_options = VerifyOptions(
            steps=steps,
            warmup=warmup,
            mean_step=mean_step,
            rounds=options.verify_rounds,
            budget_s=options.verify_budget_s,
            threads=torch.get_num_threads(),
            noise_floor=ctx.noise_floor,
            memory_limit_bytes=options.memory_limit_bytes,
        )
        argv = report.run.argv
        try:
            verifier_of = make_verifier or (lambda opts: Verifier(script_path, argv, base, opts))
            with verifier_of(verify_options) as verifier:
                run = _VerifyRun(verifier, originals, base, steps, ctx.step_s * steps)
                _verify(fix_report, results, run)
                fix_report.messages += verifier.notes
        except Exception as exc:  # noqa: BLE001 - a verification that fails costs the verification, not the report
            said = str(exc) if isinstance(exc, VerifyError) else f"{type(exc).__name__}: {exc}"
            fix_report.messages.append(f"--verify could not run: {said}")
            report.fail("verify", f"--verify could not run: {said}. The fixes it did not verify are not verified.")
            _unverified(results, "--verify could not time it")
    elif not options.verify:
        _unverified(results, "--verify times it on the whole script")
    texts = combine(fix_report.kept, originals, base)  # may drop a fix that no longer applies on the others
    fix_report.predicted_together = predicted_together(fix_report.kept)
    if not options.fix:
        return fix_report
    header = _header(report, fix_report, os.path.basename(str(options.fix)), base, options.verify)
    try:
        fix_report.patch = render_patch(header, originals, texts, base)
        write_patch(options.fix, fix_report.patch)
        fix_report.path = str(options.fix)
    except (PatchError, OSError) as exc:
        fix_report.messages.append(f"The patch was not written: {exc}")
        report.fail("fix", f"The patch was not written to {options.fix}: {exc}")
    return fix_report


def _unverified(results: list[FixResult], why: str) -> None:
    """Without a verification, a fix the what-if doubted stays out of the patch (the others are exact or measured)."""
    for result in results:
        if result.in_patch and result.doubt and result.verification is None:
            result.dropped = f"{result.doubt}; left out ({why})"
