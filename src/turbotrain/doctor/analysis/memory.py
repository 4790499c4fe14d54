"""The step's memory as the rules and the report read it: one step of the captured model measured on copies, and,
for a run that died of an out-of-memory error, the step measured at a batch that fits, what the whole batch would
need (estimated), and the fixes measured there with what each would need at the whole batch.

Measured: every byte figure of a :class:`~..record.memory_watch.StepMemory` and of a fix
(:mod:`.memory_fixes`). Estimated: a figure "at the whole batch" scales the batch-sized bytes (inputs, activations,
temporaries) linearly with the rows at each of the step's candidate peaks, and takes the largest; parameters,
buffers, gradients, optimizer state and what the optimizer allocates stay as measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from ...data.transfer import resize_batch
from ...measure import copy_for_trial
from ..record.memory_watch import LossFn, ModuleActivations, StepMemory, measure_step
from ..record.out_of_memory import OutOfMemory, out_of_memory
from ..record.recording import Capture
from ..module_stacks import blocks_text, stack_of
from .memory_fixes import Cost, FixCost, accumulated, bf16_autocast, checkpointing, eager_module, micro_batches
from .replay import surrogate_step

__all__ = [
    "FitMeasure",
    "FixEstimate",
    "measure_captured",
    "needed_bytes",
    "capacity_bytes",
    "blocks_to_checkpoint",
    "fit_after_oom",
    "MEASURE_CAP_BYTES",
    "size_text",
]

# A batch measured after an out-of-memory error is one whose failing allocation, scaled to it, is under this:
# cheap to measure on any device; the figures at the whole batch are scaled from it.
MEASURE_CAP_BYTES = 64 * 2**20


@dataclass(frozen=True)
class FixEstimate:
    """A fix measured at ``rows`` and the bytes it would need at the whole batch (estimated), and whether that fits."""

    cost: FixCost
    estimated_bytes: int
    fits: bool


@dataclass(frozen=True)
class FitMeasure:
    """After an out-of-memory error: the step measured at ``rows`` of the script's ``full_rows``, what the whole
    batch would need (estimated), the device's capacity, and each fix measured at ``rows``."""

    rows: int
    full_rows: int
    memory: StepMemory
    estimated_bytes: int
    capacity_bytes: int | None
    fixes: tuple[FixEstimate, ...]
    refused: tuple[str, ...] = ()  # fixes whose step ran out of memory at ``rows`` (under --memory-limit)


def size_text(nbytes: float | None) -> str:
    """``1.5 GiB``, ``320.0 KiB``, ``12 bytes``; ``not known`` for None."""
    if nbytes is None:
        return "not known"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} bytes"


def _copies(capture: Capture, optimizers: Sequence[Any]) -> tuple[torch.nn.Module, list[Any]]:
    # One deepcopy of both: the copied optimizers then update the copied parameters.
    return copy_for_trial((eager_module(capture.module), list(optimizers)))


def _batch(capture: Capture, rows: int | None) -> Any:
    batch = (capture.args, capture.kwargs)
    if rows is None or rows == capture.batch_size:
        return batch
    cut = resize_batch(batch, rows, rows=capture.batch_size, dim=capture.batch_dim)
    # Copies, not views: a view would hold (and be counted as) the whole batch's storage.
    return tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, cut)


def measure_captured(
    capture: Capture, optimizers: Sequence[Any], rows: int | None = None, loss_fn: LossFn = surrogate_step
) -> StepMemory:
    """One training step of copies of the captured model and its optimizers on the captured batch (cut to ``rows``),
    measured after a warm-up step that creates the optimizers' state; ``loss_fn``: the what-ifs' surrogate loss, under
    the script's autocast where it has one (:func:`.replay.under`)."""
    model, opts = _copies(capture, optimizers)
    batch = _batch(capture, rows)
    for opt in opts:
        opt.zero_grad(set_to_none=True)
    loss_fn(model, batch).backward()
    for opt in opts:
        opt.step()
    return measure_step(model, opts, [batch], loss_fn)


def needed_bytes(side: Cost, rows: int, full_rows: int) -> int:
    """A fix's side measured at ``rows``, estimated at ``full_rows`` (its step's
    :meth:`~..record.memory_watch.StepMemory.at_rows`)."""
    assert side.memory is not None  # every measured side carries its step's memory (memory_fixes._cost)
    return side.memory.at_rows(rows, full_rows)


def capacity_bytes(memory: StepMemory) -> int | None:
    """What a step may use: the GPU's total memory; on the CPU, the memory available now; under --memory-limit,
    the limit."""
    device = memory.memory
    if device.limit_bytes is not None:
        return device.limit_bytes
    return device.total_bytes if device.device.startswith("cuda") else device.free_bytes


def blocks_to_checkpoint(modules: Sequence[ModuleActivations], step_activations: int, most: int = 2) -> list[str]:
    """What to recompute in the backward: every block of the stack (one ``ModuleList``/``Sequential``'s blocks of one
    class, a transformer's layers) that together hold the most, as checkpointing is done on such stacks; else, where
    single submodules hold more, up to ``most`` of those, none inside another. Only what holds a quarter of the
    step's activations or more is worth recomputing; torch's dropout and activation modules are not blocks."""
    modules = [row for row in modules if not row.elementwise]
    chosen: list[str] = []
    for row in modules:
        if not row.name or row.total_bytes * 4 < step_activations:
            continue
        if any(row.name.startswith(c + ".") or c.startswith(row.name + ".") for c in chosen):
            continue
        chosen.append(row.name)
        if len(chosen) == most:
            break
    stack = _largest_stack(modules)
    held = {row.name: row.total_bytes for row in modules}
    if len(stack) >= 2 and sum(held[n] for n in stack) * 4 >= step_activations:
        if sum(held[n] for n in stack) >= sum(held[n] for n in chosen):
            return stack
    return chosen


def _largest_stack(modules: Sequence[ModuleActivations]) -> list[str]:
    """The blocks of one list and one class that together saved the most, in the list's order."""
    stacks: dict[tuple[str, str], list[tuple[int, str, int]]] = {}
    for row in modules:
        found = stack_of(row.name)
        if found is not None:
            stacks.setdefault((found[0], row.class_name), []).append((found[1], row.name, row.total_bytes))
    if not stacks:
        return []
    best = max(stacks.values(), key=lambda blocks: sum(b for _, _, b in blocks))
    return [name for _, name, _ in sorted(best)]


def _fitting_rows(
    capture: Capture, optimizers: Sequence[Any], oom: OutOfMemory, rows: int, loss_fn: LossFn
) -> tuple[int, StepMemory] | None:
    """The largest halving of the captured batch, from ``rows`` down, that fits and is cheap to measure, and its
    step's memory."""
    full = capture.batch_size
    while rows >= 1:
        # The failing allocation scaled to this batch: skip a batch that would take long to measure (on the CPU,
        # an allocation the system grants is touched page by page, never refused).
        if oom.requested_bytes is None or oom.requested_bytes * rows / full <= MEASURE_CAP_BYTES:
            try:
                return rows, measure_captured(capture, optimizers, rows, loss_fn)
            except (RuntimeError, MemoryError) as exc:
                _out_of_memory_or_raise(exc)
        rows //= 2
    return None


def _out_of_memory_or_raise(exc: BaseException) -> None:
    if out_of_memory(exc) is None:
        raise exc
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _micro_split(memory: StepMemory, rows: int, full: int, capacity: int | None) -> int:
    """The fewest micro-batches of the whole batch (a power of two, 2 at least, more only while they divide
    ``full``) whose micro-batch's step, estimated from the step measured at ``rows`` with the gradients the earlier
    micro-batches left held through it, fits ``capacity``."""
    k = 2
    while capacity is not None and full % (k * 2) == 0:
        if memory.at_rows(rows, -(-full // k)) + memory.gradient_bytes <= capacity:
            break
        k *= 2
    return k


def _micro_batches_fix(
    capture: Capture, optimizers: Sequence[Any], batch: Any, rows: int, memory: StepMemory, trials: _Trials
) -> FixEstimate:
    """Gradient accumulation over micro-batches of the whole batch (:func:`_micro_split`), measured at the batch
    that fits; where the measured fix does not fit, micro-batches half as large, while the whole batch divides."""
    full, capacity = capture.batch_size, capacity_bytes(memory)
    k_full = _micro_split(memory, rows, full, capacity)
    while True:
        micro = -(-full // k_full)
        smallest = capacity is None or full % (k_full * 2) or micro <= 1
        try:
            cost, needed = _micro_batches_at(capture, optimizers, batch, rows, micro, trials)
        except (RuntimeError, MemoryError) as exc:  # under --memory-limit: these micro-batches do not fit
            _out_of_memory_or_raise(exc)
            if smallest:
                raise
            k_full *= 2
            continue
        # Said at the whole batch, as --fix writes it: its micro-batches and their rows.
        cost = dataclasses.replace(cost, detail=f"{k_full} x {micro}")
        fits = capacity is not None and needed <= capacity
        if fits or smallest:
            return FixEstimate(cost, needed, fits)
        k_full *= 2


def _micro_batches_at(
    capture: Capture, optimizers: Sequence[Any], batch: Any, rows: int, micro: int, trials: _Trials
) -> tuple[FixCost, int]:
    """Micro-batches of ``micro`` rows measured on ``batch`` (``rows`` rows), and what they need: the batch split
    into them where it holds two or more (their peak, the first one's gradients held through the next, is then
    what the fix needs), else two of the batch accumulated, their peak scaled to ``micro`` rows."""
    model, loss_fn, repeats = capture.module, trials.loss_fn, trials.repeats
    if rows % micro == 0 and rows // micro >= 2:
        cost = micro_batches(model, optimizers, batch, rows // micro, rows, capture.batch_dim, loss_fn, repeats)
        return cost, needed_bytes(cost.fixed, micro, micro)
    # The batch that fits is a micro-batch's size or less (build-nanogpt: 1 of its 4 rows).
    cost = accumulated(model, optimizers, batch, 2, loss_fn, repeats)
    return cost, needed_bytes(cost.fixed, rows, micro)


def fit_after_oom(
    capture: Capture,
    optimizers: Sequence[Any],
    oom: OutOfMemory,
    loss_fn: LossFn = surrogate_step,
    autocasts: bool = False,
    repeats: int = 2,
) -> FitMeasure | None:
    """After ``oom``: the step at a batch that fits, the whole batch's estimate, and the fixes measured there (micro-
    batches to the whole batch, bf16 autocast where the script's forward ran without autocast (``autocasts``),
    checkpointing of the blocks that save the most), each step through ``loss_fn``; None when no halving of the
    captured batch fits."""
    rows = capture.batch_size // 2
    while (found := _fitting_rows(capture, optimizers, oom, rows, loss_fn)) is not None:
        rows, memory = found
        try:
            return _fixes_at(capture, optimizers, rows, memory, _Trials(loss_fn, autocasts, repeats))
        except (RuntimeError, MemoryError) as exc:
            # A size at the edge of the memory fits once and not the next time (the allocator's layout differs):
            # the fixes are measured at the next halving instead.
            _out_of_memory_or_raise(exc)
            rows //= 2
    return None


@dataclass(frozen=True)
class _Trials:
    """How the fixes after an out-of-memory error step: the loss, whether the script autocasts already, rounds."""

    loss_fn: LossFn
    autocasts: bool
    repeats: int


def _fixes_at(
    capture: Capture, optimizers: Sequence[Any], rows: int, memory: StepMemory, trials: _Trials
) -> FitMeasure:
    full, capacity = capture.batch_size, capacity_bytes(memory)
    batch, model, loss_fn, repeats = _batch(capture, rows), capture.module, trials.loss_fn, trials.repeats

    def at_full(cost: FixCost) -> FixEstimate:
        needed = needed_bytes(cost.fixed, rows, full)
        return FixEstimate(cost, needed, capacity is not None and needed <= capacity)

    tries: list[tuple[str, Callable[[], FixEstimate]]] = [
        ("micro-batches", lambda: _micro_batches_fix(capture, optimizers, batch, rows, memory, trials))
    ]
    if not trials.autocasts:  # a script under autocast has what this fix would add
        tries.append(("bf16-autocast", lambda: at_full(bf16_autocast(model, optimizers, batch, loss_fn, repeats))))
    blocks = blocks_to_checkpoint(memory.modules, memory.activation_bytes)
    if blocks:
        tries.append(
            (
                f"checkpointing {blocks_text(blocks)}",
                lambda: at_full(checkpointing(model, optimizers, batch, blocks, loss_fn, repeats)),
            )
        )
    fixes: list[FixEstimate] = []
    refused: list[str] = []
    for name, trial in tries:
        try:
            fixes.append(trial())
        except (RuntimeError, MemoryError) as exc:  # under --memory-limit: the fix needs more than the limit here
            _out_of_memory_or_raise(exc)
            refused.append(name)
    estimated = memory.at_rows(rows, full)
    return FitMeasure(rows, full, memory, estimated, capacity, tuple(fixes), tuple(refused))
