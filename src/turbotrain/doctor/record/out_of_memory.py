"""Whether an exception was an out-of-memory error (CUDA's allocator, the CPU's, MPS, XPU): its device, the bytes
it asked for, the user's line it was raised under, and the phase of the step it was raised in."""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import torch

from .measurements import MemoryPhase
from ..sites import Site, raised_at

__all__ = ["OutOfMemory", "out_of_memory"]


@dataclass(frozen=True, slots=True)
class OutOfMemory:
    """An out-of-memory error: its device kind ("cuda", "cpu", "mps", "xpu" or ""), the bytes it asked for
    when the message says, its first line, and the innermost user line it was raised under; the phase of the
    step it was raised in ("forward", "backward", "optimizer" or "" when none: loading data, the script's own
    code), from the torch frames it went through, and the step (0-based) where the recorder knew it."""

    device: str
    requested_bytes: int | None
    message: str
    site: Site | None = None
    phase: MemoryPhase | Literal[""] = ""
    step: int | None = None


_OOM_TEXT = ("out of memory", "can't allocate memory", "not enough memory")
_REQUEST = re.compile(r"tried to allocate\s+([\d.]+)\s*(bytes|[KMGT]iB|B)?", re.IGNORECASE)
_UNITS = {None: 1, "bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def out_of_memory(exc: BaseException) -> OutOfMemory | None:
    """``exc``, or the exception it was raised from, as an out-of-memory error; None when it is none."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = _classify(current)
        if found is not None:
            return found
        current = current.__cause__ or current.__context__
    return None


def _classify(exc: BaseException) -> OutOfMemory | None:
    text = str(exc)
    typed = isinstance(exc, torch.OutOfMemoryError)
    if not (
        typed or isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and any(s in text for s in _OOM_TEXT))
    ):
        return None
    lowered = text.lower()
    # torch.OutOfMemoryError is raised by the accelerators' allocators, Python's MemoryError by the host's.
    fallback = "cuda" if typed else "cpu" if isinstance(exc, MemoryError) else ""
    device = next((d for d in ("cuda", "mps", "xpu", "cpu") if d in lowered), fallback)
    match = _REQUEST.search(text)
    requested = int(float(match.group(1)) * _UNITS[match.group(2)]) if match else None
    message = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return OutOfMemory(device, requested, message, raised_at(exc.__traceback__), _phase(exc.__traceback__))


# Where a torch frame's file says the step was; the outermost such frame decides (a forward recomputed inside a
# backward, by checkpointing, is the backward's).
_PHASES: tuple[tuple[MemoryPhase, tuple[str, ...]], ...] = (
    ("optimizer", ("/torch/optim/",)),
    ("backward", ("/torch/autograd/", "/torch/_tensor.py", "/torch/utils/checkpoint.py")),
    ("forward", ("/torch/nn/modules/module.py",)),
)


def _phase(tb: TracebackType | None) -> MemoryPhase | Literal[""]:
    """The phase of the step the traceback ran through: its outermost torch frame that names one."""
    files = []
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename.replace("\\", "/"))
        tb = tb.tb_next
    for name in files:
        for phase, parts in _PHASES:
            if any(part in name for part in parts):
                return phase
    return ""
