"""Processes the script starts to run its own code (Hogwild!'s ``mp.Process(target=train)``, DDP ranks from
``torch.multiprocessing.spawn(main, nprocs=N)``): counted at the user's line that started them, with the function
each runs, so that a run that stepped no optimizer in its own process can say where its training went.
DataLoader workers and other processes that run library code are not counted."""

from __future__ import annotations

import multiprocessing.process
import sys
import threading
from typing import Any, Callable

from . import active
from .patcher import Patcher
from ..sites import is_user_file, user_site

__all__ = ["KIND", "install", "spawned_rank"]

KIND = "process_start"
_SPAWN = "torch.multiprocessing.spawn"  # the module of the wrapper its processes run


def _user_function(process: Any) -> Any:
    """The user's function ``process`` runs (``torch.multiprocessing.spawn``'s wrapper hands it on as its first
    argument), or None."""
    target = getattr(process, "_target", None)
    if getattr(target, "__module__", None) == _SPAWN:
        args = getattr(process, "_args", ())
        target = args[0] if args else None
    return target if _is_user_function(target) else None


def _is_user_function(target: Any) -> bool:
    code = getattr(target, "__code__", None)
    return code is not None and is_user_file(code.co_filename)


def spawned_rank(process: Any) -> tuple[Callable, int] | None:
    """``(fn, i)`` where ``process`` is the ``i``-th that ``torch.multiprocessing.spawn`` (or ``start_processes``)
    starts to run the user's ``fn(i, *args)``; else None."""
    target = getattr(process, "_target", None)
    args: tuple = getattr(process, "_args", ())
    if getattr(target, "__module__", None) != _SPAWN or getattr(target, "__name__", None) != "_wrap" or len(args) < 2:
        return None
    fn, index = args[0], args[1]
    return (fn, index) if _is_user_function(fn) and isinstance(index, int) else None


def _start(original: Callable) -> Callable:
    def start(self):
        probe = active.current
        if probe is not None and not probe.busy and threading.get_ident() == probe.thread:
            target = _user_function(self)
            tally = probe.tallies.tally(KIND, user_site(sys._getframe(1))) if target is not None else None
            if tally is not None:
                code = target.__code__
                tally.detail.setdefault("target", getattr(target, "__qualname__", code.co_name))
                tally.detail.setdefault("file", code.co_filename)
                tally.detail.setdefault("line", code.co_firstlineno)
                tally.add(probe.steps.step_index)
        return original(self)

    return start


def install(patcher: Patcher) -> None:
    patcher.replace(multiprocessing.process.BaseProcess, "start", _start)
