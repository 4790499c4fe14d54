"""Modules' qualified names read as a person reads a model: one ``ModuleList``/``Sequential``'s blocks of one class
(a transformer's layers, a stack) said once, ``transformer.h.0-11 (12 x Block)``, not twelve times."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Generic, Protocol, TypeVar

__all__ = ["Stacked", "stack_of", "blocks_text", "stacked", "module_text"]


def stack_of(name: str) -> tuple[str, int] | None:
    """``("transformer.h", 3)`` for ``transformer.h.3``: a block of a ``ModuleList``/``Sequential`` and its index."""
    parent, _, last = name.rpartition(".")
    return (parent, int(last)) if last.isdigit() else None


def _runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """``[(0, 3), (5, 5)]`` for 0, 1, 2, 3, 5: runs of consecutive indices, in the order given."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][1] + 1 == i:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return [(a, b) for a, b in runs]


def _run_text(a: int, b: int) -> str:
    return f"{a}-{b}" if b > a else f"{a}"


def _index_runs(indices: Sequence[int]) -> str:
    """``0-3,5`` for 0, 1, 2, 3, 5 (in the order given)."""
    return ",".join(_run_text(a, b) for a, b in _runs(indices))


def blocks_text(blocks: Sequence[str]) -> str:
    """The blocks as a person reads them: ``transformer.h.0-11`` for a run of one list's blocks, else their names."""
    said: list[str] = []
    # Neighbours of one list go together; a name off any stack is a group of its own.
    for key, group in groupby(blocks, key=lambda name: (stack_of(name) or (name, -1))[0]):
        names = list(group)
        indices = [found[1] for name in names if (found := stack_of(name))]
        if len(indices) < len(names):
            said.extend(names)
        else:
            # a root Sequential's own blocks (a compiled model's eager module: airbench's) have no list name
            said.extend(f"{key + '.' if key else ''}{_run_text(a, b)}" for a, b in _runs(indices))
    return ", ".join(said)


class _Row(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def class_name(self) -> str: ...
    @property
    def total_bytes(self) -> int: ...


R = TypeVar("R", bound=_Row)


@dataclass(frozen=True)
class Stacked(Generic[R]):
    """One module, or the same module in each block of a stack (``transformer.h.0-11.mlp``: 12 x MLP)."""

    name: str
    class_name: str
    total_bytes: int
    count: int
    first: R  # the largest of them: its class's line stands for all


def _in_stack(name: str) -> tuple[tuple[str, str], int] | None:
    """Where ``name`` sits in the first stack on its path: (the list, the path below the block), and the block's
    index; None off any stack."""
    parts = name.split(".")
    at = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    if at is None:
        return None
    return (".".join(parts[:at]), ".".join(parts[at + 1 :])), int(parts[at])


def stacked(rows: Sequence[R]) -> list[Stacked[R]]:
    """``rows`` with the same module of each block of a stack said once, their bytes summed; largest first."""
    groups: dict[tuple[str, str, str], list[tuple[int, R]]] = {}
    out: list[Stacked[R]] = []
    for row in rows:
        found = _in_stack(row.name)
        if found is None:
            out.append(Stacked(row.name, row.class_name, row.total_bytes, 1, row))
        else:
            (parent, below), index = found
            groups.setdefault((parent, below, row.class_name), []).append((index, row))
    for (parent, below, _), members in groups.items():
        first = max((row for _, row in members), key=lambda r: r.total_bytes)
        total = sum(row.total_bytes for _, row in members)
        if len(members) == 1:
            out.append(Stacked(first.name, first.class_name, total, 1, first))
            continue
        indices = _index_runs(sorted(i for i, _ in members))
        name = f"{parent + '.' if parent else ''}{indices}{'.' + below if below else ''}"
        out.append(Stacked(name, first.class_name, total, len(members), first))
    return sorted(out, key=lambda s: -s.total_bytes)


def module_text(name: str, class_name: str, count: int, where: str | None, nbytes: str) -> str:
    """``transformer.h.0-3 (4 x Block, model.py:103) 64.2 MiB``."""
    what = f"{count} x {class_name}" if count > 1 else class_name
    return f"{name} ({what}{', ' + where if where else ''}) {nbytes}"
