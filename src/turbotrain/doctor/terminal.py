"""The report in a terminal (rich): breakdown bar, bottleneck, findings ordered by what they buy."""

from __future__ import annotations

from typing import IO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .records import CATEGORIES
from .report import CATEGORY_LABELS, Report

__all__ = ["print_report", "COLORS"]

COLORS = {"data_loading": "#e4572e", "host_to_device": "#f3a712", "compute": "#29335c", "optimizer": "#669bbc",
          "host_sync": "#a8c686", "python_overhead": "#8e6c8a", "outside_step": "#9a9a9a"}
SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "dim"}


def _bar(shares: dict[str, float], width: int = 60) -> Text:
    text = Text()
    used = 0
    cells = []
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


def print_report(report: Report, file: IO[str] | None = None, width: int | None = None) -> None:
    console = Console(file=file, width=width, highlight=False)
    console.print(Text.assemble(("turbotrain doctor ", "bold"), (report.script or "", "cyan"),
                                (f"  {' '.join(report.argv)}" if report.argv else "")))
    console.print(f"[dim]{report.device}: {report.hardware}[/dim]")
    for message in report.messages:
        console.print(f"[yellow]! {message}[/yellow]")
    b = report.breakdown
    if b is None or not b.steps:
        return
    console.print(f"{len(b.steps)} step(s) measured after {report.warmup_steps} warm-up: median "
                  f"[bold]{b.median_s * 1e3:.1f} ms[/bold], p90 {b.quantile_s(0.9) * 1e3:.1f} ms per optimizer step")
    console.print(_bar(b.shares))
    legend = Text()
    for key in CATEGORIES:
        share = b.shares.get(key, 0.0)
        if share >= 0.005:
            legend.append("■ ", style=COLORS[key])
            legend.append(f"{CATEGORY_LABELS[key]} {share:.0%} ({b.seconds[key] * 1e3:.1f} ms)  ")
    console.print(legend)
    console.print(Text.assemble("Bottleneck: ", (CATEGORY_LABELS[b.bottleneck], f"bold {COLORS[b.bottleneck]}"),
                                f" ({b.shares[b.bottleneck]:.0%} of step time)"))
    if report.findings:
        table = Table(title="Findings, by what the fix buys", show_lines=True, expand=True)
        table.add_column("severity", no_wrap=True)
        table.add_column("rule / where", overflow="fold")
        table.add_column("why, and the fix", overflow="fold", ratio=3)
        table.add_column("buys", justify="right", no_wrap=True)
        for f in report.findings:
            where = f.where or (f.site.where(report.base) if f.site else "")
            buys = "-" if f.est_speedup is None else f"x{f.est_speedup:.2f}"
            buys += "\nmeasured" if f.measured else ("\nestimated" if f.est_speedup is not None else "")
            body = Text(f.message)
            body.append("\n" + f.fix.text(f.speedup), style="green")
            if f.note:
                body.append("\n" + f.note, style="dim")
            table.add_row(Text(f.severity, style=SEVERITY_STYLE[f.severity]), f"{f.rule}\n{where}", body, buys)
        console.print(table)
    else:
        console.print("[green]No findings: nothing this doctor knows of slows the step down.[/green]")
    if report.syncs:
        table = Table(title="Host syncs per step")
        for column in ("where", "kind", "per step", "ms/step", "code"):
            table.add_column(column)
        for row in report.syncs[:10]:
            table.add_row(row["where"], row["kind"], f"{row['per_step']:g}", f"{row['ms_per_step']:.3f}", row["code"])
        console.print(table)
    if report.top_ops:
        table = Table(title="Top ops (profiler window), per step")
        for column in ("op", "calls", "self CPU ms", "self device ms"):
            table.add_column(column)
        for row in report.top_ops[:8]:
            table.add_row(row["op"][:60], f"{row['calls_per_step']:g}", f"{row['self_cpu_ms_per_step']:.3f}",
                          f"{row['self_device_ms_per_step']:.3f}")
        console.print(table)
    if report.trace_path:
        console.print(f"Trace: {report.trace_path} (open in https://ui.perfetto.dev or chrome://tracing)")
