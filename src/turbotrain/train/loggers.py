"""Metric loggers: CSV (always available) and TensorBoard (when installed). Rank 0 only."""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("turbotrain")

__all__ = ["CSVLogger", "TensorBoardLogger", "make_loggers"]


class CSVLogger:
    """``metrics.csv`` with one row per log event; new metric names widen the header."""

    def __init__(self, log_dir: str | Path):
        self.path = Path(log_dir) / "metrics.csv"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []
        self.columns: list[str] = []

    def log(self, metrics: dict[str, Any]) -> None:
        self.rows.append(dict(metrics))
        new = [k for k in metrics if k not in self.columns]
        if new or not self.path.exists():
            self.columns += new
            self._rewrite()
        else:
            with open(self.path, "a", newline="") as fh:
                csv.DictWriter(fh, self.columns).writerow(metrics)

    def _rewrite(self) -> None:
        with open(self.path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, self.columns)
            writer.writeheader()
            writer.writerows(self.rows)

    def close(self) -> None:
        pass


class TensorBoardLogger:
    def __init__(self, log_dir: str | Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(Path(log_dir) / "tensorboard"))

    def log(self, metrics: dict[str, Any]) -> None:
        step = metrics.get("step", 0)
        for key, value in metrics.items():
            if key != "step" and isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def make_loggers(log_dir: str | None, names: tuple[str, ...]) -> list:
    if log_dir is None:
        return []
    loggers: list = []
    for name in names:
        if name == "csv":
            loggers.append(CSVLogger(log_dir))
        elif name == "tensorboard":
            try:
                loggers.append(TensorBoardLogger(log_dir))
            except ImportError:
                log.warning(
                    "turbotrain: TensorBoard logging skipped: the tensorboard package is not installed "
                    "(pip install 'turbotrain[tensorboard]')"
                )
    return loggers
