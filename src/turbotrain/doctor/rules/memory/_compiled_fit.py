"""A memory fix said to fit a compiled script, run compiled at the script's whole batch.

The out-of-memory finding's fixes are measured on eager copies (analysis/memory_fixes.py), and torch.compile's
graphs hold buffers of their own: a fix said to fit eagerly may not fit compiled (modded-nanogpt under 1.1 GiB:
4 micro-batches of 256 rows said to fit; its twin died in the compiled backward asking for 294.8 MiB). Here the
fixes ``--fix`` writes run, fastest first, on a copy of the model compiled as the script compiled it, on the batch the
script ran: two steps without the limit (they compile and create the optimizers' state), then one under
``--memory-limit`` (on a GPU, the device's own memory), its peak taken, then one timed with the allocator as it is
without the limit. Micro-batches that run out of memory are
run again at half their rows while the batch divides.

Not a rule (the leading ``_`` keeps it out of the rule registry).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ....measure import copy_for_trial
from ...analysis.memory_fixes import bf16_loss, split_rows, train_step
from ...record.memory_limit import enforced, plain_heap, trim_heap
from ...record.memory_watch import resident_bytes
from ...record.out_of_memory import out_of_memory
from ...record.window_memory import PeakProbe
from ...findings import Evidence, one_line
from ..compile._common import compile_seconds, compiled_in_place, compiled_like, compiled_model
from ._loop_edits import LOOP_FIXES, micro_batch_count

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...analysis.memory import FitMeasure
    from ...analysis.memory_fixes import FixCost

__all__ = ["CompiledRun", "CompiledCheck", "compiled_check", "CHECK_CAP_S", "MOST_RUNS"]

CHECK_CAP_S = 240.0  # the most the check may be expected to take: the script's first compiles and 4 steps a run
MOST_RUNS = 3  # compiled runs at most (each compiles afresh)


@dataclass(frozen=True)
class CompiledRun(Evidence):
    """A fix run compiled at the script's batch: ``detail`` as --fix writes it ("4 x 256", "cpu"); where it ran, its
    step's peak (``peak_bytes``: what the step started from, ``held_bytes``, the copy's parameters, gradients,
    optimizer state and batch, plus the most the step added to that: the process's resident memory on the CPU, the
    allocator's on a GPU) and its seconds; where it ran out of memory, what the failing allocation asked for."""

    fix: str
    detail: str
    ran: bool
    peak_bytes: int | None = None
    step_seconds: float | None = None
    requested_bytes: int | None = None
    held_bytes: int | None = None


@dataclass(frozen=True)
class CompiledCheck(Evidence):
    """The runs, in order (the last the first that ran, where one did), or why none was made."""

    runs: tuple[CompiledRun, ...] = ()
    skipped: str | None = None

    @property
    def first_ran(self) -> CompiledRun | None:
        return next((run for run in self.runs if run.ran), None)


def compiled_check(ctx: Context, fit: FitMeasure, fits: Sequence[FixCost]) -> CompiledCheck:
    """``fits`` (fastest first) of the kinds --fix writes, run compiled at the script's batch until one runs."""
    model = compiled_model(ctx)
    if model is None:  # not `or`: a compiled module's truth is its original's len(), which most modules lack
        model = compiled_in_place(ctx)
    capture = ctx.capture
    if model is None or capture is None:
        return CompiledCheck(skipped="the script compiled functions, not its model, so no copy was compiled alike")
    candidates = [cost for cost in fits if cost.fix in LOOP_FIXES]
    if not candidates:
        return CompiledCheck(skipped="the fixes that fit are made by hand, so none was run compiled")
    first_compiles, _ = compile_seconds(ctx)
    step_s = max(c.fixed.step_seconds for c in candidates) * fit.full_rows / fit.rows
    expected = first_compiles + 4 * step_s
    if expected > CHECK_CAP_S:
        return CompiledCheck(
            skipped=f"a compiled run of a fix would take about {expected:.0f} s (the script's compiles took "
            f"{first_compiles:.0f} s), more than the {CHECK_CAP_S:.0f} s this check may take"
        )
    runs: list[CompiledRun] = []
    try:
        for cost in candidates:
            for detail in _details(cost, fit.full_rows):
                if len(runs) == MOST_RUNS:
                    return CompiledCheck(tuple(runs))
                run = _run(ctx, model, cost.fix, detail, fit.full_rows)
                runs.append(run)
                if run.ran:
                    return CompiledCheck(tuple(runs))
    except Exception as exc:  # noqa: BLE001 - a copy that does not compile costs this check only, said
        return CompiledCheck(tuple(runs), skipped=f"a compiled copy failed: {one_line(exc)}")
    return CompiledCheck(tuple(runs))


def _details(cost: FixCost, full_rows: int) -> list[str]:
    """The fix as said at the script's batch, then (micro-batches) half as large while the batch divides."""
    if cost.fix != "micro-batches":
        return [cost.detail]
    k, out = micro_batch_count(cost.detail), []
    while full_rows % k == 0 and k <= full_rows:
        out.append(f"{k} x {full_rows // k}")
        k *= 2
    return out


def _run(ctx: Context, model: torch.nn.Module, fix: str, detail: str, full_rows: int) -> CompiledRun:
    capture = ctx.capture
    assert capture is not None  # compiled_check checked it
    original = getattr(model, "_orig_mod", model)
    # One deepcopy of both: the copied optimizers then update the copied parameters.
    copy, optimizers = copy_for_trial((original, [opt for opt, _ in ctx.optimizers]))
    # Each copy is a new module for the forward's guards: without a reset, a few runs after the script's own compiles
    # reach torch's recompile limit, and the rest would run eagerly, unsaid.
    torch.compiler.reset()
    compiled = compiled_like(model, copy)
    batch: Any = (capture.args, capture.kwargs)
    loss_fn = ctx.script_loss
    batches = [batch]
    if fix == "micro-batches":
        batches = split_rows(batch, full_rows, capture.batch_dim, micro_batch_count(detail))
    else:
        loss_fn = bf16_loss(loss_fn, detail)
    gpu = ctx.on_gpu
    try:
        for _ in range(2):  # the first compiles; the second runs what a recompile after it (grads now set) needs
            train_step(compiled, optimizers, batches, loss_fn)
        probe, held = PeakProbe(gpu), resident_bytes(copy, optimizers, batches)
        with enforced(held_bytes=held):
            probe.start()
            train_step(compiled, optimizers, batches, loss_fn)
            window = probe.stop()
        with plain_heap():
            started = time.perf_counter()
            train_step(compiled, optimizers, batches, loss_fn)
            if gpu:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
    except (RuntimeError, MemoryError) as exc:
        oom = out_of_memory(exc)
        if oom is None:
            raise
        return CompiledRun(fix, detail, ran=False, requested_bytes=oom.requested_bytes)
    finally:
        del compiled, copy, optimizers
        torch.compiler.reset()
        gc.collect()
        trim_heap()  # the timed step's blocks, now free
        if gpu:
            torch.cuda.empty_cache()
    peak = held + window.peak_bytes - window.start_bytes if window is not None else None
    return CompiledRun(fix, detail, ran=True, peak_bytes=peak, step_seconds=seconds, held_bytes=held)
