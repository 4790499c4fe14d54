"""CPU threads that fit the cores: torch's intra-op pool sized to the cores this process may really use.

torch sizes its intra-op pool to the cores it sees. When a CPU quota is smaller than that,
another process holds a core, or DataLoader workers want cores too, every parallel op waits
at a barrier for a descheduled thread (steps 15-20x slower on a 2-core machine with one
busy neighbour). ``Plan.intra_op_threads`` sets the pool (``torch.set_num_threads``), and
:func:`fit_to_cores` splits the usable cores between intra-op threads and loader workers.

Numerics: exact in the registry's sense (same function, only float rounding may differ).
A parallel reduction splits its input into one chunk per thread and adds the partial sums,
so another thread count adds in another order; no op changes precision or algorithm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..plan import Plan
from .model_info import ANY_MODEL
from .policy import Export, timed
from .registry import BenchEntry, Order, Speedup, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime import Runtime

__all__ = ["set_intra_op_threads", "fit_to_cores", "fit_plan", "max_workers_for", "thread_values"]


def set_intra_op_threads(threads: int) -> int:
    """``torch.set_num_threads(threads)`` for this process; returns the count it replaced."""
    if threads < 1:
        raise ValueError(f"intra-op threads must be >= 1, got {threads}")
    before = torch.get_num_threads()
    if threads != before:
        torch.set_num_threads(threads)
    return before


def max_workers_for(usable_cores: int) -> int:
    """The most DataLoader workers that leave the training process half the cores (none on 1 core)."""
    return usable_cores // 2


def fit_to_cores(
    usable_cores: int, num_workers: int | None = None, threads: int | None = None
) -> tuple[int, int | None]:
    """(intra-op threads, num_workers) that together fit ``usable_cores``.

    Workers are capped at half the cores (none when there is one core); the threads get the
    rest, at most ``threads`` when given, never fewer than 1. ``num_workers=None`` (the
    loader's own, unknown here) counts as no workers and stays None.
    """
    usable = max(1, usable_cores)
    workers = None if num_workers is None else min(num_workers, max_workers_for(usable))
    room = max(1, usable - (workers or 0))
    return (min(threads, room) if threads else room), workers


def fit_plan(plan: Plan, usable_cores: int, current_threads: int, loader_workers: int | None = None) -> Plan:
    """``plan`` with intra-op threads and DataLoader workers that fit ``usable_cores`` together.

    Workers are the plan's (else ``loader_workers``, the loader's own), capped by
    :func:`max_workers_for`; threads are the plan's (else ``current_threads``, torch's now),
    lowered to the cores the workers leave. Switches that already fit are left as they are.
    """
    threads_now = plan.intra_op_threads or current_threads
    workers = plan.num_workers if plan.num_workers is not None else loader_workers
    threads, fitted = fit_to_cores(usable_cores, workers, threads_now)
    changes: dict = {}
    if threads != threads_now:
        changes["intra_op_threads"] = threads
    if fitted is not None and fitted != workers:
        changes["num_workers"] = fitted
        if fitted == 0 and plan.persistent_workers:
            changes["persistent_workers"] = None
    return plan.replace(**changes) if changes else plan


def thread_values(usable_cores: int, current: int) -> tuple[int, ...]:
    """Intra-op thread counts worth timing, best guess first: all usable cores, half, one (not ``current``)."""
    usable = max(1, usable_cores)
    return tuple(v for v in dict.fromkeys((usable, max(1, usable // 2), 1)) if v != current)


def _apply(rt: Runtime) -> None:
    threads = rt.plan.intra_op_threads
    if threads is not None:  # prepare applies an entry only where its switch is active
        set_intra_op_threads(threads)


def _requires(hw, plan) -> str | None:
    return None if not hw.is_cuda else "intra-op threads are for CPU training (on a GPU the host mostly waits)"


def _recommend(hw, info):
    """For CPU training, torch's thread count lowered to the usable cores (quota and affinity) where it
    exceeds them; a count that already fits (OMP_NUM_THREADS=1, say) is left alone."""
    if hw.is_cuda:
        return None
    threads = fit_to_cores(hw.usable_cores, threads=hw.intra_op_threads or None)[0]
    return threads if threads != hw.intra_op_threads else None


def _tune_values(hw, base: Plan) -> tuple[int, ...]:
    """The usable cores, half, one: whichever torch does not run now."""
    return thread_values(hw.usable_cores, base.intra_op_threads or hw.intra_op_threads)


def _code(plan: Plan, framework: str) -> list[str]:
    if plan.intra_op_threads is None:
        return []
    return [
        f"torch.set_num_threads({plan.intra_op_threads})  # intra-op CPU threads; or "
        f"OMP_NUM_THREADS={plan.intra_op_threads} in the environment"
    ]


ENTRY = register(
    Speedup(
        name="cpu_threads",
        field="intra_op_threads",
        order=Order.GLOBAL,
        apply=_apply,
        requires=_requires,
        recommend=_recommend,
        exact=True,
        doctor_rules=("cpu-oversubscribed",),
        summary="torch's intra-op threads sized to the cores this process may really use",
        bench=BenchEntry(("mlp", "gpt"), {"intra_op_threads": 1}),
        applies_to=ANY_MODEL,
        export=Export(code=_code),
        tune=timed(_tune_values, nothing_to_try="torch already runs 1 thread on {hw.usable_cores} usable core"),
    )
)
