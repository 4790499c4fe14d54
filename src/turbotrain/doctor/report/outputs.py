"""Writing the JSON and HTML reports asked for, where one that cannot be written is said by the others."""

from __future__ import annotations

from typing import Callable

from .html import write_html
from .model import Report

__all__ = ["write_reports"]


def write_reports(report: Report, json: str | None = None, html: str | None = None) -> set[str]:
    """Write the JSON and HTML reports asked for; the labels of those written. One that cannot be written is a
    failure of the report (:meth:`Report.fail`), which the other, written after it, and the terminal say."""
    writers: dict[str, Callable[[str], None]] = {
        "JSON": report.write_json,
        "HTML": lambda path: write_html(report, path),
    }
    written = set()
    for label, path in (("JSON", json), ("HTML", html)):
        if not path:
            continue
        try:
            writers[label](path)
            written.add(label)
        except OSError as exc:
            report.fail(label.lower(), f"The {label} report was not written to {path}: {exc}.")
    return written
