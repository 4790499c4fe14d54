"""The fixes in words: one line per fix (predicted beside verified), its diff; for the terminal and HTML."""

from __future__ import annotations

import html
import statistics
from typing import Any

from rich.console import Console
from rich.text import Text

from ..analysis.memory import size_text
from .fix_results import FixReport, FixResult, Verification

__all__ = ["fix_line", "loss_text", "print_fixes", "fixes_html", "DIFF_LINES"]

DIFF_LINES = 12  # the most diff lines one fix shows in the terminal (the patch file has them all)
_DIFF_STYLE = {"+": "green", "-": "red"}


def loss_text(match: dict[str, Any] | None) -> str:
    if not match:
        return ""
    expected, ok, diff = match.get("expected"), match.get("match"), match.get("max_rel_diff")
    if expected == "bitwise":
        return "losses bitwise equal" if ok else f"losses not bitwise equal (largest relative difference {diff})"
    if expected == "tolerance":
        tolerance = f"{match.get('tolerance', 0.05):.0%}"
        state = f"within {tolerance}" if ok else f"over the {tolerance} tolerance"
        return f"losses {state} (numerics change; largest relative difference {diff})"
    return f"losses not compared ({match.get('note', 'no losses')})"


def fix_line(predicted: float | None, check: Verification | None) -> str:
    """``predicted x1.80, verified x1.75 (faster), losses bitwise equal``."""
    parts = [f"predicted x{predicted:.2f}" if predicted else "predicted: not measured"]
    if check is not None:
        if check.error:
            parts.append(f"not verified: {check.error}")
        elif check.original_out_of_memory and check.patched_ms:
            peak = check.peak_memory
            held = f", peak memory ({peak['kind']}) {size_text(peak['patched_bytes'])}" if peak else ""
            parts.append(
                f"verified: the original ran out of memory, the patched script ran "
                f"({statistics.median(check.patched_ms):.1f} ms a step{held})"
            )
        elif check.speedup is not None:
            parts.append(f"verified x{check.speedup:.2f} ({check.verdict})")
            loss = loss_text(check.loss_match)
            if loss:
                parts.append(loss)
            if check.graphs_kept:
                parts.append(kept_text(check.graphs_kept))
            if check.peak_memory:
                parts.append(peak_text(check.peak_memory))
    return ", ".join(parts)


def peak_text(peak: dict[str, Any]) -> str:
    """``peak memory (process resident) 1.2 GiB, patched 880 MiB (-27%)``."""
    original, patched = peak["original_bytes"], peak["patched_bytes"]
    ratio = patched / original - 1 if original else None
    change = "" if ratio is None else f" ({ratio:+.1%})" if abs(ratio) < 0.01 else f" ({ratio:+.0%})"
    return f"peak memory ({peak['kind']}) {size_text(original)}, patched {size_text(patched)}{change}"


def kept_text(kept: dict[str, Any]) -> str:
    """``graphs kept a step: original 7 nodes and 4 bytes, patched none`` (after backward a kept graph holds its
    nodes, its saved tensors freed; before it, or with ``retain_graph``, their bytes too)."""

    def side(name: str) -> str:
        g = kept[name]
        if not g["growing"]:
            return f"{name} none"
        return f"{name} {g['nodes_per_step']:g} nodes and {size_text(g['bytes_per_step'])}"

    return f"graphs kept a step: {side('original')}, {side('patched')}"


def _status(f: FixResult) -> tuple[str, str]:
    if f.by_hand:
        return "BY HAND", "yellow"
    if f.dropped:
        return "LEFT OUT", "dim"
    return "EDIT", "bold green"


def print_fixes(console: Console, fixes: FixReport, width: int) -> None:
    console.print()
    where = f" (patch: {fixes.path})" if fixes.path else ""
    console.print(Text(f"Fixes{where}", style="bold underline"))
    if fixes.predicted_together or fixes.together:
        console.print(Text("together: " + fix_line(fixes.predicted_together, fixes.together), style="bold"))
    for f in fixes.fixes:
        status, style = _status(f)
        console.print()
        console.print(
            Text.assemble((f"{status:<9}", style), (f.rule, "bold"), "  ", (f.where, "cyan")),
            no_wrap=True,
            overflow="ellipsis",
        )
        console.print(Text(f"  {f.label}"), overflow="fold")
        detail = f.by_hand or f.dropped
        if detail:
            console.print(Text(f"  {detail}", style="dim"), overflow="fold")
        if f.diff is not None and not f.by_hand:  # f.edit, spelled so that f.diff is known to be set
            console.print(Text(f"  {fix_line(f.predicted, f.verification)}"), overflow="fold")
            # The changed lines only, wrapped rather than cut: the change is what a reader looks for here.
            lines = [line for line in f.diff.splitlines() if line[:1] in "+-" and not line.startswith(("---", "+++"))]
            for line in lines[:DIFF_LINES]:
                console.print(Text(f"  {line}", style=_DIFF_STYLE.get(line[:1], "")), overflow="fold")
            if len(lines) > DIFF_LINES:
                console.print(Text(f"  ... {len(lines) - DIFF_LINES} more line(s) in the patch", style="dim"))
    for message in fixes.messages:
        console.print(Text(f"! {message}", style="yellow"), overflow="fold")


def _diff_html(diff: str) -> str:
    rows = []
    for line in diff.splitlines():
        kind = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "")
        if line.startswith(("---", "+++")):
            kind = "file"
        rows.append(f'<span class="{kind}">{html.escape(line)}</span>')
    return '<pre class="diff">' + "\n".join(rows) + "</pre>"


def _cell(value: float | None) -> str:
    return f"x{value:.2f}" if value else "-"


def fixes_html(fixes: FixReport) -> str:
    """The fixes section: predicted vs verified side by side, each fix's diff under it."""
    esc = html.escape
    together = fixes.together
    parts = [
        f'<h2 id="fixes">Fixes{f" (patch: {esc(fixes.path)})" if fixes.path else ""}</h2>',
        "<table><tr><th>status</th><th>rule</th><th>where</th><th>fix</th><th>predicted</th><th>verified</th>"
        "<th>losses</th></tr>",
    ]
    for f in fixes.fixes:
        check = f.verification
        status = _status(f)[0].lower()
        verified = (
            esc(check.error)
            if check and check.error
            else f"{_cell(check.speedup)} ({esc(check.verdict)})"
            if check
            else "-"
        )
        parts.append(
            f'<tr data-rule="{esc(f.rule)}"><td>{status}</td><td>{esc(f.rule)}</td><td>{esc(f.where)}</td>'
            f"<td>{esc(f.label)}</td><td>{_cell(f.predicted)}</td><td>{verified}</td>"
            f"<td>{esc(loss_text(check.loss_match) if check else '')}</td></tr>"
        )
    if fixes.predicted_together or together:
        verified = _cell(together.speedup) if together else "-"
        parts.append(
            f"<tr><td></td><td><b>together</b></td><td></td><td></td>"
            f"<td>{_cell(fixes.predicted_together)}</td><td>{verified}</td>"
            f"<td>{esc(loss_text(together.loss_match) if together else '')}</td></tr>"
        )
    parts.append("</table>")
    for f in fixes.fixes:
        note = f.by_hand or f.dropped
        parts.append(
            f'<div class="finding fix" data-rule="{esc(f.rule)}"><span class="rule">{esc(f.rule)}</span>'
            f'<span class="where">{esc(f.where)}</span><p>{esc(f.label)}</p>'
        )
        if note:
            parts.append(f'<p class="note">{esc(note)}</p>')
        if f.diff:
            parts.append(_diff_html(f.diff))
        parts.append("</div>")
    parts += [f'<div class="msg">{esc(m)}</div>' for m in fixes.messages]
    return "".join(parts)
