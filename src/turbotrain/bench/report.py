"""The bench's outputs: a rich table on the terminal, JSON, a markdown table, a PNG bar chart."""

from __future__ import annotations

import json
import os
from pathlib import Path
from rich.console import Console
from rich.table import Table

from .results import BenchResult, Row, WorkloadResult
from .stats import FASTER, NOISE, SLOWER, UNVERIFIED

__all__ = ["print_tables", "write_json", "markdown", "write_markdown", "write_plot", "summary_lines", "COLUMNS"]

COLUMNS = (
    "plan",
    "throughput",
    "step",
    "spread",
    "speed-up",
    "call",
    "peak memory",
    "warm-up s cold / warm",
    "loss first → final",
    "bytes read",
    "MFU",
)
# Shown only for the workloads that have them: MFU (GPT on a GPU), bytes read (the data workload).
_OPTIONAL = {"bytes read": lambda r: bool(r.read_bytes), "MFU": lambda r: r.mfu is not None}


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"  # pragma: no cover


def _fmt_step(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _fmt_speedup(row: Row) -> str:
    if row.speedup is None:
        return "-"
    text = f"{row.speedup:.2f}x"
    if row.verdict == NOISE:
        return f"~{text}"  # inside the spread: not called a speed-up (or a slow-down)
    if row.verdict == UNVERIFIED:
        return f"{text}?"  # too few repeats to judge it by their spread
    return text


def _fmt_opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _cells(row: Row, unit: str, columns: tuple[str, ...]) -> list[str]:
    label = row.label + (" *" if row.note else "")
    if not row.measured:
        why = f"error: {row.error}" if row.error else f"skipped: {row.skip}"
        return [label, why] + [""] * (len(columns) - 2)
    loss = f"{row.first_loss:.3f} → {row.final_loss:.3f}" + ("" if row.learning else " (not falling!)")
    cells = {
        "plan": label,
        "throughput": f"{row.units_per_s:,.0f} {unit}/s",
        "step": _fmt_step(row.step_s),
        "spread": f"±{row.spread * 100:.0f}%",  # type: ignore[operator]  # a measured row has one
        "speed-up": _fmt_speedup(row),
        "call": row.verdict or "-",
        "peak memory": _fmt_bytes(row.peak_memory_bytes),
        "warm-up s cold / warm": f"{_fmt_opt(row.warmup_cold_s, '.2f')} / {_fmt_opt(row.warmup_warm_s, '.2f')}",
        "loss first → final": loss,
        "bytes read": ", ".join(f"{scheme} {_fmt_bytes(n)}" for scheme, n in sorted(row.read_bytes.items())) or "-",
        "MFU": "-" if row.mfu is None else f"{row.mfu * 100:.1f}%",
    }
    return [cells[c] for c in columns]


def _columns(w: WorkloadResult) -> tuple[str, ...]:
    return tuple(c for c in COLUMNS if c not in _OPTIONAL or any(_OPTIONAL[c](r) for r in w.rows))


def _title(w: WorkloadResult) -> str:
    if w.skip:
        return f"{w.name}: not run"
    size = f"{w.params / 1e6:.1f}M parameters" if w.params >= 1e5 else f"{w.params:,} parameters"
    about = f"; {w.description}" if w.description else ""
    return f"{w.name} ({w.scale} scale, {size}, batch {w.batch_size}{about})"


def _shown(w: WorkloadResult) -> list[Row]:
    """Rows for the table: measured or failed (skipped ones are listed underneath)."""
    return [r for r in w.rows if r.skip is None and (r.measured or r.error)]


def _skipped_lines(w: WorkloadResult) -> list[str]:
    """What is listed under a workload's table: why rows were not measured, or once why the workload was not."""
    if w.skip:
        return [f"skipped the whole workload: {w.skip}"]
    return [f"skipped {row.label}: {row.skip}" for row in w.rows if row.skip is not None]


def print_tables(result: BenchResult, console: Console | None = None) -> None:
    console = console or Console()
    console.print(
        f"[bold]turbotrain bench[/] on {result.machine['summary']}, torch {result.machine['torch']}, "
        f"{result.machine['date']}"
    )
    for w in result.workloads:
        shown = _shown(w)
        if shown:
            table = Table(title=_title(w), title_justify="left")
            cols = _columns(w)
            for col in cols:
                table.add_column(col, justify="left" if col == "plan" else "right")
            for row in shown:
                style = {FASTER: "green", SLOWER: "red"}.get(row.verdict or "", None)
                table.add_row(*_cells(row, w.unit, cols), style=style if not row.error else "red")
            console.print(table)
        else:
            console.print(f"[bold]{_title(w)}[/]")
        for line in _skipped_lines(w):
            console.print(f"  [dim]{line}[/]")
        for row in shown:
            if row.note:
                console.print(f"  [dim]* {row.label}: {row.note}[/]")
    for note in result.notes:
        console.print(f"[dim]note: {note}[/]")


def write_json(result: BenchResult, path: str | os.PathLike) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return out


def markdown(result: BenchResult) -> str:
    """Markdown tables, one per workload, with the skipped rows and notes under each."""
    m = result.machine
    lines = [
        f"Machine: {m['summary']}; torch {m['torch']}"
        + (f" (CUDA {m['cuda']})" if m.get("cuda") else "")
        + f", {m.get('torch_threads')} threads; load average {m.get('load_average')}; {m['date']}.",
        "",
    ]
    for w in result.workloads:
        lines += [f"### {_title(w)}", ""]
        shown = _shown(w)
        if shown:
            cols = _columns(w)
            lines += ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
            for row in shown:
                lines.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(row, w.unit, cols)) + " |")
            lines.append("")
        for row in shown:
            if row.note:
                lines.append(f"- \\* {row.label}: {row.note}")
        lines += [f"- {line}" for line in _skipped_lines(w)]
        lines.append("")
    lines += [f"- note: {note}" for note in result.notes]
    return "\n".join(lines).rstrip() + "\n"


def write_markdown(result: BenchResult, path: str | os.PathLike) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(result))
    return out


def _ratio_range(row: Row, base: Row) -> tuple[float, float]:
    """Lowest and highest per-round ratio, for the error bar around the median speed-up."""
    pairs = (
        zip(base.units_per_s_runs, row.units_per_s_runs)
        if row.inverse
        else zip(row.units_per_s_runs, base.units_per_s_runs)
    )
    ratios = [a / b for a, b in pairs]
    return min(ratios), max(ratios)


def write_plot(result: BenchResult, path: str | os.PathLike) -> Path:
    """A PNG: per workload, one bar per plan with its speed-up over naive and the range of the repeats."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    panels: list[tuple[WorkloadResult, list[Row], dict[str, Row]]] = []
    for w in result.workloads:
        bases = {r.label: r for r in w.rows if r.kind == "naive" and r.measured}
        bars = [r for r in w.rows if r.measured and r.kind != "naive" and r.speedup is not None]
        if bars:
            panels.append((w, bars, bases))
    height = sum(max(1.5, 0.45 * len(b) + 1) for _, b, _ in panels) or 2
    fig, axes = plt.subplots(
        max(1, len(panels)),
        1,
        figsize=(8, height),
        squeeze=False,
        gridspec_kw={"height_ratios": [len(b) + 1 for _, b, _ in panels] or [1]},
    )
    colours: dict[str | None, str] = {FASTER: "#2e7d32", SLOWER: "#c62828", NOISE: "#9e9e9e", UNVERIFIED: "#9e9e9e"}
    for ax, (w, bars, bases) in zip(axes[:, 0], panels):
        labels = [r.label + (" (data path)" if r.path == "loader" and "data path" not in r.label else "") for r in bars]
        values = [r.speedup for r in bars]
        lows, highs = zip(*(_ratio_range(r, bases[r.baseline]) for r in bars))  # type: ignore[index]  # speed-up rows have one
        errors = [[max(0.0, v - lo) for v, lo in zip(values, lows)], [max(0.0, hi - v) for v, hi in zip(values, highs)]]
        ax.barh(labels, values, xerr=errors, color=[colours.get(r.verdict, "#9e9e9e") for r in bars], capsize=3)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.invert_yaxis()
        log = max(highs) > 10  # the data workload's 100x next to 2x: on a linear axis the 2x bars vanish
        if log:
            ax.set_xscale("log")
        ax.set_title(
            f"{w.name}: speed-up over naive ({w.unit}/s{', log scale' if log else ''}); grey = within noise", fontsize=9
        )
        ax.tick_params(labelsize=8)
    if not panels:
        axes[0, 0].text(0.5, 0.5, "no measured speed-ups", ha="center", va="center")
        axes[0, 0].set_axis_off()
    axes[-1, 0].set_xlabel(f"speed-up (x); {result.machine['device']}, torch {result.machine['torch']}")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def summary_lines(result: BenchResult) -> list[str]:
    """One line per workload: the fast plan's speed-up (for logs and the CLI's last line)."""
    out: list[str] = []
    for w in result.workloads:
        if w.skip:
            out.append(f"{w.name}: not run ({w.skip})")
            continue
        # One line per path the fast plan ran on that has its own naive row (data: one per epoch).
        fast = [r for r in w.rows if r.kind == "fast" and r.path != "loader" and r.measured and r.speedup is not None]
        if fast:
            calls = [
                f"{_fmt_speedup(r)} ({r.verdict})" + (f" in {r.path}" if r.path != "resident" else "") for r in fast
            ]
            out.append(f"{w.name}: fast plan {', '.join(calls)} over naive")
    return out
