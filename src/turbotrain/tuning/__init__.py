"""tuning: the fastest safe Plan for a model on this machine, plus batch-size and num_workers finders.

``tt.tune(model, loss_fn, loader, optimizer_fn, time_budget_s=120) -> Plan`` (see :mod:`.api`);
``turbotrain tune`` on the command line (:mod:`.cli`). The pieces are usable alone:
:func:`find_batch_size`, :func:`find_num_workers`, :func:`search_plan` and the exports in
:mod:`.export`.

One name, one thing: ``tt.tune`` (``turbotrain.tune``) is the function, this package is
``turbotrain.tuning``; there is no ``turbotrain.tune`` module (docs/architecture.md, "Names").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy

if TYPE_CHECKING:
    from .api import TuneError, TuneResult, tune, tune_report
    from .batch_size import BatchSizeResult, find_batch_size
    from .search import search_plan
    from .workers import WorkersResult, find_num_workers

# Imported on first use: `turbotrain --help` reads this package's command without importing torch.
__getattr__, __dir__ = lazy(
    globals(),
    {
        "tune": ".api",
        "tune_report": ".api",
        "TuneResult": ".api",
        "TuneError": ".api",
        "find_batch_size": ".batch_size",
        "BatchSizeResult": ".batch_size",
        "find_num_workers": ".workers",
        "WorkersResult": ".workers",
        "search_plan": ".search",
    },
)

__all__ = [
    "tune",
    "tune_report",
    "TuneResult",
    "TuneError",
    "find_batch_size",
    "BatchSizeResult",
    "find_num_workers",
    "WorkersResult",
    "search_plan",
]
