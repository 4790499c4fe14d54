"""Collectives the script's thread blocks in: FSDP's all-gathers and reduce-scatters, and the script's own.

On CPU tensors (gloo) a collective called without ``async_op`` returns when it has completed: the thread waited for
the slowest rank to arrive and for the transfer, the whole call exposed. FSDP (``fully_shard``, and the older
wrapper) calls ``torch.distributed`` this way on CPU: an all-gather before each sharded module's forward and
backward, a reduce-scatter after its backward. So does a script that averages its gradients by hand or all-reduces
its loss for a log line. Each such call is timed per step; the calls of one step become one :class:`CommStep`,
the same record DDP's hook gives (:mod:`.collectives`), so the ranks' breakdown, the straggler and the alignment
of ranks read both alike. A collective's completion is the same moment on every rank, as an all-reduce's is.

On CUDA tensors the call returns once the collective is queued on a stream: the host time says nothing about the
wait, so those calls are not timed.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import types
from collections import defaultdict
from collections.abc import Callable
from typing import Any, NamedTuple

from .collectives import CommStep, ThreadCpu, union
from .patcher import Patcher

__all__ = ["BlockingCollectives", "blocking_functions", "caller_kind"]


def blocking_functions() -> list[str]:
    """The public torch.distributed functions that take ``async_op``: without it they block until done (on CPU
    tensors). Read from torch, whose list grows (``all_gather_single`` is what FSDP calls in 2.13)."""
    import inspect

    import torch.distributed as dist

    names = []
    for name, function in sorted(vars(dist).items()):  # vars: no deprecated alias is looked up
        # type(), not isinstance(): the deprecated ``reduce_op`` object warns when asked for its class.
        if name.startswith("_") or type(function) is not types.FunctionType:
            continue
        try:
            if "async_op" in inspect.signature(function).parameters:
                names.append(name)
        except (TypeError, ValueError):
            continue
    return names


def caller_kind(module: str) -> str:
    """Whose collective this is, from the module that called it: "fsdp" (either FSDP) or "collectives"."""
    return "fsdp" if module.startswith("torch.distributed.fsdp") else "collectives"


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import torch

    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, torch.Tensor):
            return value
    return None


class _Call(NamedTuple):
    start: float
    end: float
    kind: str  # caller_kind's
    name: str  # the torch.distributed function
    passes: int  # backward passes begun in the step when it was called


class BlockingCollectives:
    """Times the script thread's blocking collectives per step (``position()[0]``); ``steps()`` at the end."""

    def __init__(self, position: Callable[[], tuple[int, int]], live: Callable[[], bool]) -> None:
        self.position = position
        self.live = live
        self.cells: dict[int, list[_Call]] = defaultdict(list)  # per step, its calls
        self.cpu = ThreadCpu()  # the script's thread's CPU time at the start of each step's last call
        self.open: str | None = None  # the call the thread is blocked in now ("all_gather_into_tensor (fsdp)")
        self._thread = threading.get_ident()

    def install(self, patcher: Patcher) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        self._thread = threading.get_ident()
        self.cpu.follow_this_thread()
        for name in blocking_functions():
            # Callers reach them as torch.distributed.X or through distributed_c10d: patch both names.
            timed = self._timed(name, getattr(dist, name))
            for owner in (dist, distributed_c10d):
                if getattr(owner, name, None) is not None:
                    patcher.put(owner, name, timed)

    def _timed(self, name: str, original: Callable) -> Callable:
        cells, live, perf = self.cells, self.live, time.perf_counter

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            # Not timed: asynchronous, another thread's, after the recording, or one collective inside another.
            if kwargs.get("async_op") or self.open or threading.get_ident() != self._thread or not live():
                return original(*args, **kwargs)
            tensor = _first_tensor(args, kwargs)
            if tensor is not None and tensor.device.type != "cpu":  # queued on a stream, not waited for
                return original(*args, **kwargs)
            kind = caller_kind(sys._getframe(1).f_globals.get("__name__", ""))
            step, passes = self.position()
            self.cpu.note(step)
            self.open = f"{name} ({kind})"
            start = perf()
            try:
                return original(*args, **kwargs)
            finally:
                cells[step].append(_Call(start, perf(), kind, name, passes))
                self.open = None

        return timed

    def steps(self) -> tuple[CommStep, ...]:
        out = []
        for step, cells in sorted(self.cells.items()):
            spans = union([(c.start, c.end) for c in cells])
            waited = sum(b - a for a, b in spans)
            cpu, wait = self.cpu.since_last_step(step)
            out.append(
                CommStep(
                    step=step,
                    buckets=len(cells),
                    exposed_s=waited,  # the thread blocked for all of it: nothing overlapped its compute
                    busy_s=waited,
                    overlap_s=0.0,
                    done_at=max(c.end for c in cells),
                    cpu_s=cpu,
                    cpu_wait_s=wait,
                    kind="fsdp" if any(c.kind == "fsdp" for c in cells) else "collectives",
                    passes=_scattered_passes(cells),
                )
            )
        return tuple(out)


def _scattered_passes(cells: list[_Call]) -> int:
    """The backward passes whose gradients FSDP reduce-scattered (more than one: micro-batches accumulated with
    each one synchronized); 1 where none was."""
    return len({c.passes for c in cells if c.kind == "fsdp" and "reduce_scatter" in c.name}) or 1
