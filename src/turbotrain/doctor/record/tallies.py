"""What the wrappers learn about the script besides time: events per line, its loaders, modules and optimizers.

Written by the instrumentation, discovery and the gap sampler while the script runs; read once when the
recording is turned into plain data (:mod:`.recording`).
"""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

from ..records import LoaderTally, Tally
from ..sites import Site

__all__ = ["Tallies"]


class Tallies:
    """Per-line event tallies and the objects the script built, keyed so that nothing keeps them alive."""

    def __init__(self) -> None:
        self.events: dict[tuple[str, Site], Tally] = {}
        self.loaders: dict[int, LoaderTally] = {}
        self.optimizers: list[tuple[weakref.ReferenceType[Any], Site | None]] = []
        self.optimizer_ids: set[int] = set()
        self.module_sites: dict[int, tuple[weakref.ReferenceType[Any], Site]] = {}  # id -> (module, where built)
        self.matmul_shapes: dict[Site, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.gap_samples: Counter[Site] = Counter()   # user lines seen running untimed before the forward
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
