"""The table of what the tuner tried: candidate, samples/s, speed-up, peak memory, compile time, verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # pragma: no cover
    from .api import TuneResult

__all__ = ["render", "attempts_table", "format_rate"]

_STYLE = {"accepted": "green", "chosen": "bold green", "rejected": "red", "skipped": "yellow", "baseline": "cyan"}


def format_rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _mib(n: int | None) -> str:
    return f"{n / 2**20:,.0f} MiB" if n else "-"


def _candidate(label: str) -> list[str]:
    """One switch per line (the chosen row lists the whole plan): a switch such as
    ``precision=bf16-mixed`` is never broken across lines."""
    return label.removeprefix("chosen: ").split(", ")


def attempts_table(result: "TuneResult") -> Table:
    """What was tried, readable at 80 columns: why a candidate was rejected goes under its name
    (the candidate column is the one that wraps, never narrower than its longest switch)."""
    search = result.search
    title = f"turbotrain tune on {result.hardware}" + (" (cached)" if result.from_cache else "")
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True
    )
    switches = [_candidate(row.label) for row in search.attempts]
    longest = max((len(word) for lines in switches for line in lines for word in line.split()), default=8)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("#", "right"),
        ("candidate", "left"),
        ("samples/s", "right"),
        ("vs naive", "right"),
        ("peak mem", "right"),
        ("compile s", "right"),
        ("verdict", "left"),
    )
    for name, justify in columns:
        wraps = name == "candidate"
        table.add_column(
            name, justify=justify, overflow="fold", no_wrap=not wraps, min_width=longest if wraps else None
        )
    for i, (row, lines) in enumerate(zip(search.attempts, switches)):
        style = _STYLE.get(row.status, "")
        candidate = Text("\n".join(lines))
        if row.reason:
            candidate.append("\n" + row.reason, style="dim")
        if row.pays_after_steps is not None and "pays after" not in row.reason:
            pays = f"{row.pays_after_steps:,.0f} steps" if row.pays_after_steps != float("inf") else "never"
            candidate.append(f"\ncompile pays after {pays}", style="dim")
        table.add_row(
            str(i),
            candidate,
            format_rate(row.samples_per_s) if row.samples_per_s else "-",
            f"{row.speedup:.2f}x" if row.speedup else "-",
            _mib(row.peak_memory_bytes),
            f"{row.compile_s:.1f}" if row.compile_s is not None else "-",
            Text(row.status, style=style),
        )
    return table


def _say(console: Console, markup: str) -> None:
    """A line under the table, indented by two; wrapped lines keep the indent."""
    console.print(Padding(Text.from_markup(markup), (0, 0, 0, 2), expand=False))


def render(result: "TuneResult", console: Console | None = None) -> None:
    console = console or Console()
    search = result.search
    for note in search.notes:
        _say(console, escape(note))
    console.print(attempts_table(result))
    for name, why in search.left_out:
        _say(console, f"not tried: [bold]{name}[/]: {escape(why)}")
    for field, value in result.by_rule.items():
        _say(
            console,
            f"by rule: [bold]{field}={value}[/] (exact; acts on the host-to-device copy, "
            "which a step trial cannot time)",
        )
    if result.workers is not None:
        w = result.workers
        tried = ", ".join(f"{n}: {format_rate(rate)}" for n, rate in w.tried)
        _say(
            console,
            f"num_workers finder: [bold]{w.num_workers}[/] (batches/s by workers: {tried}; "
            f"stopped: {w.stopped_by}; bound {w.bound} by {w.bound_by})",
        )
    if result.batch_size is not None:
        b = result.batch_size
        tried = ", ".join(f"{n}: {out}" for n, _, out in b.tried)
        accum = f" x {b.grad_accum_steps} accumulation steps" if b.grad_accum_steps > 1 else ""
        _say(
            console,
            f"batch-size finder{' (under compile)' if b.under_compile else ''}: "
            f"[bold]{b.batch_size}{accum}[/] at {_mib(b.peak_memory_bytes)} of {_mib(b.limit_bytes)} "
            f"less {b.margin:.0%} ({tried}; stopped: {b.stopped_by})",
        )
    spent = (
        f"tuning took {result.elapsed_s:.1f}s of a {result.budget_s:.0f}s budget "
        f"({search.compile_s:.1f}s compiling; {search.steps} timed steps per trial)"
    )
    console.print(Text(search.message, style="bold"))
    _say(console, spent)
