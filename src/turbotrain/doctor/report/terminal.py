"""The report in a terminal (rich): breakdown bar, bottleneck, findings ordered by what they buy.

Made to be read in an 80-column terminal: a finding is a few lines (severity, rule, file:line,
gain, the message and the one fix for how the script is written); the fix in every framework and
the full notes stay in the HTML and JSON reports. The fix shown is said in the framework whose loop ran
(plain PyTorch, a Lightning ``Trainer``, Fabric, Accelerate or a Hugging Face ``Trainer``). Low findings
that cannot matter on this machine and model (GPU-only habits on a CPU run) are folded into one line per
reason; the HTML and JSON reports keep them whole. Text is wrapped between words only, so a token
such as ``precision=bf16-mixed`` or ``train.py:42`` is never split; what does not fit in a
finding's lines is cut with an ellipsis, and a long path loses its beginning, never its file:line.

The ``*_text`` helpers say the report's figures in words; the HTML report uses the same ones.
"""

from __future__ import annotations

import os
from typing import IO, Any

from rich.console import Console
from rich.text import Text

from ..analysis.machine import MachineFacts, NoiseWarning
from ..analysis.periodic import PeriodicRow
from ..findings import FOLDS, FRAMEWORK_LABELS, Finding, Framework
from ..record.measurements import CATEGORIES, Category
from .model import Report
from .palette import CATEGORY_LABELS, COLORS

__all__ = [
    "print_report",
    "COLORS",
    "FINDING_LINES",
    "framework",
    "chosen_fix",
    "gain_text",
    "steps_text",
    "machine_items",
    "noise_text",
    "periodic_text",
    "shorten_left",
    "folded_text",
]

SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "dim"}
FINDING_LINES = 6  # the most lines one finding takes in the terminal (its blank separator aside)
_INDENT = "  "
_FRAMEWORK_LABEL: dict[Framework, str] = {**FRAMEWORK_LABELS, "pytorch": ""}


# -- the report's figures in words (shared with the HTML report) ------------------------------------


def framework(report: Report) -> Framework:
    """The framework whose loop ran: ``pytorch``, ``lightning`` (its ``Trainer``), ``fabric``, ``accelerate`` or
    ``hf_trainer``, as the recording saw it step the optimizer (an import alone decides nothing)."""
    return report.framework or "pytorch"


def folded_text(findings: list[Finding]) -> list[str]:
    """One line per reason for the findings folded out of the terminal: ``3 GPU-only habits: rule, ...``."""
    by_reason: dict[str, list[str]] = {}
    for f in findings:
        if f.folded and f.fold is not None:
            by_reason.setdefault(f.fold, [])
            if f.rule not in by_reason[f.fold]:
                by_reason[f.fold].append(f.rule)
    lines = []
    for reason, rules in by_reason.items():
        count = sum(1 for f in findings if f.folded and f.fold == reason)
        one, many = FOLDS.get(reason, ("finding that cannot matter here", "findings that cannot matter here"))
        lines.append(f"{count} {one if count == 1 else many}: {', '.join(rules)}; see the HTML report")
    return lines


def chosen_fix(finding: Finding, how: Framework = "pytorch") -> tuple[str, str]:
    """(framework label, text) of the one fix to show: the script's framework's, else PyTorch's, else the Plan's."""
    fix = finding.fix
    for name in (how, "pytorch"):
        text = fix.in_framework(name)
        if text:
            return _FRAMEWORK_LABEL[name], text
    if fix.plan:
        return "turbotrain", "tt.Plan(" + ", ".join(f"{k}={v!r}" for k, v in fix.plan.items()) + ")"
    return "", ""


def gain_text(est_speedup: float | None, measured: bool) -> str:
    """``x1.54 measured``, ``x1.20 estimated`` or ``-``."""
    if est_speedup is None:
        return "-"
    return f"x{est_speedup:.2f} {'measured' if measured else 'estimated'}"


def steps_text(report: Report) -> tuple[str, str, str]:
    """The steps line around its headline: (before, headline, after). The headline is the bar's own total
    (its phases plus what other processes took), so the bar, its phases and the headline are one statistic."""
    b = report.breakdown
    assert b is not None  # asked only of a report with a breakdown
    total = sum(b.seconds.values()) + b.interference_s
    settled = f"; {len(b.settling)} slower step(s) after it left out as still warming up" if b.settling else ""
    return (
        f"{len(b.steps)} step(s) measured after {report.warmup_steps} warm-up{settled}: ",
        f"{total * 1e3:.1f} ms per step",
        f" (mean; median {b.median_s * 1e3:.1f} ms, p90 {b.quantile_s(0.9) * 1e3:.1f} ms; "
        f"delimited by {report.step_delimiter})",
    )


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def machine_items(m: MachineFacts) -> list[str]:
    """The machine as the run saw it, one short phrase per fact present."""
    items = []
    limits = [
        f"{label} {_num(value)}"
        for value, label in ((m.cpu_quota, "quota"), (m.affinity_cores, "affinity"))
        if value is not None
    ]
    if m.usable_cores is not None or m.host_cores is not None:
        cores = f"{_num(m.usable_cores)} usable" if m.usable_cores is not None else ""
        if m.host_cores is not None:
            cores += f" of {_num(m.host_cores)}" if cores else _num(m.host_cores)
        items.append(f"cores: {cores}" + (f" ({', '.join(limits)})" if limits else ""))
    elif limits:
        items.append(f"cores: {', '.join(limits)}")
    threads = [
        f"{_num(value)} {label}"
        for value, label in ((m.intra_op_threads, "intra-op"), (m.interop_threads, "inter-op"))
        if value is not None
    ]
    if threads:
        items.append(f"torch threads: {', '.join(threads)}")
    if m.dataloader_workers is not None:
        busy = f" ({m.worker_load:.1f} busy cores)" if m.worker_load and m.dataloader_workers else ""
        items.append(f"DataLoader workers: {_num(m.dataloader_workers)}{busy}")
    load = []
    if m.other_load is not None:
        load.append(f"{m.other_load:.1f} busy cores")
    if m.loadavg_1m is not None:
        load.append(f"load avg {m.loadavg_1m:.2f}")
    if load:
        items.append(f"other processes: {', '.join(load)}")
    if m.dispersion is not None:
        items.append(f"step time p90/p10: {m.dispersion:.1f}")
    return items


def noise_text(noise: NoiseWarning) -> tuple[str, list[str]]:
    """(headline, reasons) of the noise warning."""
    head = (
        f"Noisy measurement ({noise.level}): gains under x{noise.min_speedup:g} cannot be told from noise on this "
        "machine now."
    )
    return head, list(noise.reasons)


def periodic_text(row: PeriodicRow) -> str:
    """``validation every 20 steps costs 41% of training time (812 ms each) at train.py:57; every 160 ...``"""
    text = row.kind + (f" every {row.every} steps" if row.every else "")
    if row.share is not None:
        text += f" costs {row.share:.0%} of training time"
    text += f" ({row.cost_ms:.0f} ms each)"
    if row.where:
        text += f" at {row.where}"
    if row.suggested_every:
        text += f"; every {row.suggested_every} steps keeps it under {row.target_share:.0%}"
    return text


def shorten_left(text: str, width: int) -> str:
    """``text`` cut from the left to ``width`` characters (a path keeps its file name and line)."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]


# -- layout -------------------------------------------------------------------------------------------


def _lines(console: Console, text: Text, width: int, limit: int) -> list[Text]:
    """``text`` wrapped between words into at most ``limit`` lines of ``width``; an ellipsis marks a cut."""
    if limit <= 0:
        return []
    lines = list(text.wrap(console, width, overflow="fold"))
    if len(lines) > limit:
        lines = lines[:limit]
        last = lines[-1]
        last.rstrip()
        last.truncate(width - 1)
        last.append("…")
    return lines


def _hanging(console: Console, prefix: str, text: Text, width: int) -> None:
    """``prefix`` then ``text``, its later lines indented under the first."""
    pad = " " * len(prefix)
    for i, line in enumerate(text.wrap(console, width - len(prefix), overflow="fold")):
        console.print(Text(pad if i else prefix, style=text.style).append_text(line), no_wrap=True)


def _packed(console: Console, items: list[Text], width: int, indent: str = "") -> None:
    """Print ``items`` side by side, breaking lines between items (an item stays whole when it fits)."""
    line = Text(indent)
    for item in items:
        if line.cell_len > len(indent) and line.cell_len + 2 + item.cell_len > width:
            console.print(line)
            line = Text(indent)
        if line.cell_len > len(indent):
            line.append("  ")
        line.append_text(item)
    if line.cell_len > len(indent):
        console.print(line)


def _finding(console: Console, f: Finding, report: Report, how: Framework, width: int) -> None:
    where = f.where or (f.site.where(report.base) if f.site else "")
    gain = gain_text(f.est_speedup, f.measured)
    head = Text.assemble((f"{f.severity.upper():<6}", SEVERITY_STYLE.get(f.severity, "")), " ", (f.rule, "bold"))
    body = width - len(_INDENT)
    if where and head.cell_len + 2 + len(where) + 2 + len(gain) <= width:
        head.append("  ")
        head.append(where, style="cyan")
        where = ""
    head.append(" " * max(2, width - head.cell_len - len(gain)))
    head.append(gain, style="bold" if f.measured else "")
    console.print(head, overflow="ellipsis", no_wrap=True)
    rows = 1
    if where:  # too long for the first line: on its own, cut from the left
        console.print(Text(_INDENT + shorten_left(where, body), style="cyan"), no_wrap=True)
        rows += 1
    label, fix_text = chosen_fix(f, how)
    fix = Text(f"fix{f' ({label})' if label else ''}: ", style="green bold")
    fix.append(fix_text, style="green")
    fix_lines = _lines(console, fix, body, 2)
    left = FINDING_LINES - rows - len(fix_lines)
    message = _lines(console, Text(f.message), body, min(3, left))
    note = _lines(console, Text(f.note, style="dim"), body, left - len(message)) if f.note else []
    for line in message + fix_lines + note:
        console.print(Text(_INDENT).append_text(line), no_wrap=True)


def print_report(report: Report, file: IO[str] | None = None, width: int | None = None) -> None:
    console = Console(file=file, width=width, highlight=False, emoji=False)
    width = console.width
    console.print(
        Text.assemble(
            ("turbotrain doctor ", "bold"),
            (report.script or "", "cyan"),
            (f"  {' '.join(report.argv)}" if report.argv else ""),
        )
    )
    if report.hardware:  # not known for a run with no step to read
        console.print(Text(f"{report.device}: {report.hardware}", style="dim"))
    if report.noise:
        head, reasons = noise_text(report.noise)
        _hanging(console, "! ", Text(head, style="bold yellow"), width)
        for reason in reasons:
            _hanging(console, f"{_INDENT}- ", Text(reason, style="yellow"), width)
    if report.machine is not None:
        _packed(console, [Text(item, style="dim") for item in machine_items(report.machine)], width, indent="")
    for message in report.messages:
        _hanging(console, "! ", Text(message, style="yellow"), width)
    b = report.breakdown
    if b is None or not b.steps:
        _memory(console, report, width, findings=True)  # a run that died of an out-of-memory error
        return
    before, median, after = steps_text(report)
    console.print(Text.assemble(before, (median, "bold"), after))
    console.print(_bar(b.shares, min(60, width)))
    legend = []
    for key in CATEGORIES:
        share = b.shares.get(key, 0.0)
        if share >= 0.005:
            legend.append(
                Text.assemble(
                    ("■ ", COLORS[key]), f"{CATEGORY_LABELS[key]} {share:.0%} ({b.seconds[key] * 1e3:.1f} ms)"
                )
            )
    if b.interference_s >= 0.005 * (sum(b.seconds.values()) + b.interference_s):
        legend.append(Text(f"other processes {b.interference_s * 1e3:.1f} ms (not in the bar)"))
    _packed(console, legend, width)
    from .ranks import bottleneck_wait

    console.print(
        Text.assemble(
            "Bottleneck: ",
            (CATEGORY_LABELS[b.bottleneck], f"bold {COLORS[b.bottleneck]}"),
            f" ({b.shares[b.bottleneck]:.0%} of step time{bottleneck_wait(report)})",
        )
    )
    _memory(console, report, width)
    for line in compiled_lines(report):
        _hanging(console, "", Text(line), width)
    for entry in report.periodic:
        _hanging(console, "↻ ", Text(periodic_text(entry)), width)
    if report.ranks is not None:
        from .ranks import print_ranks

        print_ranks(console, report.ranks, width)
    shown = [f for f in report.findings if not f.folded]
    if report.findings:
        how = framework(report)
        console.print()
        if shown:
            console.print(Text("Findings, by what the fix buys", style="bold underline"))
        else:
            console.print("[green]No findings that matter on this machine and model.[/green]")
        for f in shown:
            console.print()
            _finding(console, f, report, how, width)
        folded = folded_text(report.findings)
        if folded and shown:
            console.print()
        for line in folded:
            _hanging(console, "+ ", Text(line, style="dim"), width)
        console.print()
        console.print(
            Text(
                "Each fix for PyTorch, Lightning, Fabric, Accelerate, the HF Trainer and tt.Plan, with "
                "the full notes: the --html and --json reports.",
                style="dim",
            )
        )
    else:
        console.print("[green]No findings: nothing this doctor knows of slows the step down.[/green]")
    if report.fixes is not None:
        from .fix_section import print_fixes

        print_fixes(console, report.fixes, width)
    if report.syncs:
        _rows(
            console,
            "Host syncs per step",
            ["where", "kind", "per step", "ms/step", "code"],
            [
                [shorten_left(r.where, 32), r.kind, f"{r.per_step:g}", f"{r.ms_per_step:.3f}", r.code]
                for r in report.syncs[:10]
            ],
            width,
        )
    if report.top_ops:
        _rows(
            console,
            "Top ops (profiler window), per step",
            ["calls", "self CPU ms", "self device ms", "op"],
            [
                [
                    f"{r.calls_per_step:g}",
                    f"{r.self_cpu_ms_per_step:.3f}",
                    f"{r.self_device_ms_per_step:.3f}",
                    r.op,
                ]
                for r in report.top_ops[:8]
            ],
            width,
        )
    if report.trace_path:
        console.print(f"Trace: {report.trace_path} (open in https://ui.perfetto.dev or chrome://tracing)")


def compiled_lines(report: Report) -> list[str]:
    """What torch.compile did: one line of totals, one per compiled code of the script's (the findings say why)."""
    facts = report.compiled
    if facts is None:
        return []
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    codes = [c for c in facts.codes if not c.code.file.startswith(package)]  # the doctor's own hooks compiled too
    # A job's section is its first rank's (the breakdown's): say so, and which ranks compiled otherwise.
    rank = f" (rank {report.ranks.ranks[0].rank})" if report.ranks is not None and report.ranks.ranks else ""
    lines = [
        f"torch.compile{rank}: {facts.compile_s:.1f} s compiling; {sum(c.graphs for c in codes)} graphs, "
        f"{sum(len(c.breaks) for c in codes)} graph breaks, {sum(len(c.recompiles) for c in codes)} recompiles"
        + (f", {facts.fell_back} fell back to eager" if facts.fell_back else "")
    ]
    timed = facts.in_graphs
    if timed is not None and timed.step_ms > 0:
        lines.append(
            f"  profiled steps: {timed.forward_ms + timed.backward_ms:.2f} ms of {timed.step_ms:.2f} in compiled "
            f"graphs (forward {timed.forward_ms:.2f}, backward {timed.backward_ms:.2f}); "
            f"{timed.outside_ms / timed.step_ms:.0%} outside them (Python, eager ops, the optimizer)"
        )
    for c in codes[:4]:
        where = c.site.where(report.base) if c.site is not None else c.name
        lines.append(
            f"  {c.name} ({where}): {c.graphs} graphs, {len(c.breaks)} breaks, {len(c.recompiles)} recompiles, "
            f"{c.first_compile_s:.1f} s first compile + {c.recompile_s:.1f} s recompiling"
            + (f"; {c.cache_hits} of {c.cache_hits + c.cache_misses} graphs from the cache" if c.cache_hits else "")
            + ("; hit the recompile limit, eager since" if c.fallback is not None else "")
        )
    return lines + other_ranks_compiling(report)


def other_ranks_compiling(report: Report) -> list[str]:
    """On a job, the ranks past the first that recompiled or compiled in the measured steps, where the first did
    not do as much (a rank that recompiles alone keeps the others waiting: the straggler finding says so)."""
    if report.ranks is None or len(report.ranks.ranks) < 2:
        return []
    first, *others = report.ranks.ranks
    seen = first.compile
    lines = []
    for r in others:
        c = r.compile
        if c is None or (
            seen is not None and c.run_recompiles <= seen.run_recompiles and c.window_s < seen.window_s + 0.1
        ):
            continue
        lines.append(
            f"  rank {r.rank}: {c.run_recompiles} recompiles in its run, {c.window_s:.1f} s compiling in the measured "
            f"steps" + ("; hit the recompile limit, eager since" if c.eager_in_window else "")
        )
    return lines


def _memory(console: Console, report: Report, width: int, findings: bool = False) -> None:
    """The memory section's lines; with ``findings``, also the out-of-memory finding (a run with no step)."""
    from .memory import memory_lines

    if report.memory is not None:
        for line in memory_lines(report.memory):
            text = line.lstrip()
            _hanging(console, line[: len(line) - len(text)], Text(text), width)
    for f in report.findings if findings else ():
        if f.rule == "out-of-memory":
            console.print()
            _finding(console, f, report, framework(report), width)


def _rows(console: Console, title: str, columns: list[str], rows: list[list[str]], width: int) -> None:
    """A plain table, one line per row; the last column (code, op names) is cut to what is left."""
    console.print()
    console.print(Text(title, style="bold underline"))
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns[:-1])]
    for cells, style in [(columns, "bold")] + [(r, "") for r in rows]:
        line = "  ".join(c.ljust(w) for c, w in zip(cells, widths))
        console.print(Text(f"{line}  {cells[-1]}", style=style), no_wrap=True, overflow="ellipsis")


def _bar(shares: dict[Category, float], width: int = 60) -> Text:
    text = Text()
    used = 0
    cells: list[list[Any]] = []  # [category, width]: the width is adjusted in place
    for key in CATEGORIES:
        n = round(shares.get(key, 0.0) * width)
        cells.append([key, n])
        used += n
    if cells and used != width:  # rounding: the largest segment absorbs the difference
        biggest = max(cells, key=lambda c: c[1])
        biggest[1] += width - used
    for key, n in cells:
        if n > 0:
            text.append("█" * n, style=COLORS[key])
    return text
