"""The names and colours of the breakdown's categories, shared by the terminal, the HTML and the ranks' picture."""

from __future__ import annotations

from ..record.measurements import Category

__all__ = ["CATEGORY_LABELS", "COLORS"]

CATEGORY_LABELS: dict[Category, str] = {
    "data_loading": "data loading",
    "host_to_device": "host->device copies",
    "compute": "compute (fwd+bwd)",
    "optimizer": "optimizer",
    "host_sync": "host syncs",
    "python_overhead": "python/dispatch overhead",
    "outside_step": "outside the step",
}

COLORS: dict[Category, str] = {
    "data_loading": "#e4572e",
    "host_to_device": "#f3a712",
    "compute": "#29335c",
    "optimizer": "#669bbc",
    "host_sync": "#a8c686",
    "python_overhead": "#8e6c8a",
    "outside_step": "#9a9a9a",
}
