"""What the wrappers learn about the script besides time: events per line, its loaders, modules and optimizers.

Written by the instrumentation, discovery and the gap sampler while the script runs; read once when the
recording is turned into plain data (:mod:`.recording`).
"""

from __future__ import annotations

import weakref
from collections import Counter, defaultdict
from typing import Any, Callable

from .measurements import EventCounts, LoaderRecord
from ..sites import Site

__all__ = ["Tallies", "Tally", "LoaderTally"]


class Tallies:
    """Per-line event tallies and the objects the script built, keyed so that nothing keeps them alive."""

    def __init__(self) -> None:
        self.events: dict[tuple[str, Site], Tally] = {}
        self.loaders: dict[int, LoaderTally] = {}
        self.optimizers: list[tuple[weakref.ReferenceType[Any], Site | None]] = []
        self.optimizer_ids: set[int] = set()
        self.module_sites: dict[int, tuple[weakref.ReferenceType[Any], Site]] = {}  # id -> (module, where built)
        self.matmul_shapes: dict[Site, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.gap_samples: Counter[Site] = Counter()  # user lines seen running untimed before the forward
        # zero_grad calls between a step's forward and its backward, and elsewhere: fresh-process trials clear
        # gradients where the script does.
        self.zero_grads: Counter[str] = Counter()

    def tally(self, kind: str, site: Site | None) -> Tally | None:
        """The tally of ``kind`` events at ``site`` (None for no site: the event is not the user's)."""
        if site is None:
            return None
        key = (kind, site)
        found = self.events.get(key)
        if found is None:
            found = self.events[key] = Tally()
        return found

    def note_optimizer(self, optimizer: Any, site: Site | None) -> bool:
        """Remember an optimizer once; True when it was new."""
        if id(optimizer) in self.optimizer_ids:
            return False
        self.optimizer_ids.add(id(optimizer))
        self.optimizers.append((weakref.ref(optimizer), site))
        return True

    def live_optimizers(self) -> list[Any]:
        return [opt for opt in (ref() for ref, _ in self.optimizers) if opt is not None]


class Tally:
    """Per-step counts, seconds and bytes of one kind of event at one site, while the script runs."""

    __slots__ = ("by_step", "detail")

    def __init__(self) -> None:
        self.by_step: dict[int, list[float]] = defaultdict(lambda: [0, 0.0, 0])
        self.detail: dict[str, Any] = {}

    def add(self, step: int, seconds: float = 0.0, nbytes: int = 0) -> None:
        cell = self.by_step[step]
        cell[0] += 1
        cell[1] += seconds
        cell[2] += nbytes

    def freeze(self, kind: str = "", site: Site | None = None) -> EventCounts:
        cells = tuple((step, int(c[0]), float(c[1]), int(c[2])) for step, c in sorted(self.by_step.items()))
        # Tuples in the detail (a tensor's shape) become lists: what JSON gives back.
        detail = {k: list(v) if isinstance(v, tuple) else v for k, v in self.detail.items()}
        return EventCounts(kind, site, cells, detail)


class LoaderTally:
    """A DataLoader the script iterates, while it runs: its batches' waits per step."""

    __slots__ = ("loader", "site", "settings", "nexts", "starts", "iterator")

    def __init__(self, loader: Any, site: Site | None, settings: dict[str, Any]) -> None:
        self.loader, self.site, self.settings = loader, site, settings
        self.iterator: Callable[[], Any] | None = None  # a weak reference to the iterator last read
        self.nexts = Tally()  # batches fetched and seconds waited
        self.starts: list[tuple[int, float]] = []  # (step, seconds to the first batch) per iter()

    def freeze(self, key: int) -> LoaderRecord:
        return LoaderRecord(
            key, self.site, dict(self.settings), self.nexts.freeze("data", self.site), tuple(self.starts)
        )
