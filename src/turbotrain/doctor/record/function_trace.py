"""Which of the user's functions ran: a trace hook on calls only (no line events).

Static rules ask whether their line's function ran (:meth:`Context.function_ran`). A trace hook
costs a Python call per frame, too much for measured steps, so the recorder turns it on for the
warm-up and the profiler window only, and pauses it while torch.compile compiles (:meth:`pause`).
Another tracer (a debugger, coverage) is never displaced: then nothing is known (``ran_code`` is None).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from ..sites import is_user_file

__all__ = ["FunctionTracer"]


class FunctionTracer:
    def __init__(self) -> None:
        # By id: a code object's hash covers its constants, and code torch.compile rewrote can hold a dict there.
        self.ran_code: dict[int, Any] | None = {}
        self._on = False  # the hook is installed (on ``_thread``)
        self._wanted = False  # trace(True) asked for it
        self._paused = False
        self._thread: int | None = None

    def trace(self, on: bool) -> None:
        self._wanted = on
        self._apply()

    def pause(self, paused: bool) -> None:
        """Off while torch.compile compiles: dynamo's and Inductor's Python would pay the hook on every call they
        make (a GPT's first compile took 1.5x as long), and none of those frames is the user's. A compile on
        another thread leaves the traced one as it is."""
        if self._thread is None or threading.get_ident() == self._thread:
            self._paused = paused
            self._apply()

    def _apply(self) -> None:
        on = self._wanted and not self._paused
        if on and not self._on and self.ran_code is not None:
            if sys.gettrace() is not None:
                self.ran_code = None
                return
            sys.settrace(self._on_call)
            self._on, self._thread = True, threading.get_ident()
        elif not on and self._on:
            sys.settrace(None)
            self._on = False

    def _on_call(self, frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        ran = self.ran_code  # never None while the hook is on
        if ran is not None and id(code) not in ran and is_user_file(code.co_filename):
            ran[id(code)] = code
        return None


def _untrace_forked_child() -> None:
    # fork copies the trace function: a DataLoader worker started in the warm-up would build every batch slower.
    if isinstance(getattr(sys.gettrace(), "__self__", None), FunctionTracer):
        sys.settrace(None)


os.register_at_fork(after_in_child=_untrace_forked_child)
