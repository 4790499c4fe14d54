"""Progress display: a rich bar on a terminal, quiet log lines otherwise.

Updated only at the logging cadence (never per step) and without rich's refresh thread,
so it costs nothing measurable in the training loop.
"""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["make_progress"]


def _fmt(metrics: dict[str, Any]) -> str:
    parts = []
    for key in ("train_loss", "val_loss", "samples_per_s"):
        value = metrics.get(key)
        if isinstance(value, float):
            parts.append(f"{key}={value:.4g}" if key != "samples_per_s" else f"{value:,.0f} samples/s")
    return "  ".join(parts)


class LineProgress:
    """One plain line per log event, for files, CI logs and pipes."""

    def __init__(self, total: int | None, stream=None):
        self.total = total
        self.stream = stream or sys.stderr
        self.start = time.monotonic()

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        total = f"/{self.total}" if self.total else ""
        eta = ""
        if self.total and step:
            left = (time.monotonic() - self.start) / step * (self.total - step)
            eta = f"  eta {left:,.0f}s"
        print(
            f"[turbotrain] step {step}{total}  epoch {metrics.get('epoch', 0)}  {_fmt(metrics)}{eta}",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        pass


class RichProgress:
    def __init__(self, total: int | None):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        from rich.console import Console

        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            console=Console(stderr=True),
            auto_refresh=False,
            transient=False,
        )
        self.task = self.progress.add_task("train", total=total, info="")
        self.progress.start()

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        self.progress.update(self.task, completed=step, info=_fmt(metrics))
        self.progress.refresh()

    def close(self) -> None:
        self.progress.stop()


class NoProgress:
    def update(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def make_progress(mode: bool | str, total: int | None, enabled: bool = True):
    if not enabled or mode is False:
        return NoProgress()
    if mode == "auto" and not sys.stderr.isatty():
        return LineProgress(total)
    return RichProgress(total)
