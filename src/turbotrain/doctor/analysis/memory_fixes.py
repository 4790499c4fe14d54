"""Fixes that trade memory for time, each measured for both on fresh copies of the user's model: activation
checkpointing of chosen blocks, bf16 autocast, ``zero_grad(set_to_none=True)``, and a smaller micro-batch
with gradient accumulation to the same effective batch. Here, not in ``whatif/``: a memory rule's own measurer
(stage 3) calls them.

Each fix runs its baseline and itself in the same call, on their own ``copy.deepcopy`` of the model and its
optimizers (copied together, so the copied optimizers update the copied parameters), run eagerly (torch.compile's
graphs are not compiled again for each): one warm-up step (timed: given the budget left, a fix whose rounds it could
not hold is not measured further), one step measured by
:func:`~turbotrain.doctor.record.memory_watch.measure_step` for the peak, then plain steps, baseline and fix
alternating, the fastest of each for the time. The batch is ``(args, kwargs)`` as captured.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from ...measure import copy_for_trial
from ..module_stacks import blocks_text
from ..record.memory_watch import LossFn, Optimizers, StepMemory, measure_step
from .replay import surrogate_step

CLEARLY_APART = 3.0  # one side this many times the other's step: no further round changes what is said

# Whether the what-if budget left holds this many seconds (a rule's TimeLeft.allows).
Allows = Callable[[float], bool]


class OverBudget(Exception):
    """A fix whose warm-up steps show its measuring would not fit the budget left; the message says so."""


__all__ = [
    "Cost",
    "FixCost",
    "OverBudget",
    "checkpoint_blocks",
    "checkpointing",
    "bf16_autocast",
    "bf16_loss",
    "set_to_none",
    "micro_batches",
    "accumulated",
    "eager_module",
    "split_rows",
    "train_step",
]


@dataclass(frozen=True, slots=True)
class Cost:
    """A step's peak bytes (``StepMemory.peak_bytes``; on CUDA the allocator's peak) and its seconds, and the step's
    memory to estimate it at another batch (:meth:`~..record.memory_watch.StepMemory.at_rows`)."""

    peak_bytes: int
    step_seconds: float
    memory: StepMemory | None = None


@dataclass(frozen=True, slots=True)
class FixCost:
    """A fix and its baseline, measured in the same call. ``detail`` says what was changed."""

    fix: str
    detail: str
    baseline: Cost
    fixed: Cost


@dataclass
class _Variant:
    model: torch.nn.Module
    optimizers: Sequence[torch.optim.Optimizer]
    batches: Sequence[Any]
    loss_fn: LossFn
    set_to_none: bool = True


def checkpointing(
    model: torch.nn.Module,
    optimizers: Optimizers,
    batch: Any,
    blocks: Sequence[str],
    loss_fn: LossFn = surrogate_step,
    repeats: int = 3,
    allows: Allows | None = None,
) -> FixCost:
    """Activation checkpointing (``torch.utils.checkpoint``, non-reentrant) of the submodules named ``blocks``."""
    fixed = _variant(model, optimizers, batch, loss_fn)
    checkpoint_blocks(fixed.model, blocks)
    baseline = _variant(model, optimizers, batch, loss_fn)
    return _compare("checkpointing", blocks_text(blocks), baseline, fixed, repeats, allows)


def checkpoint_blocks(model: torch.nn.Module, blocks: Sequence[str]) -> None:
    """Make the submodules of ``model`` named ``blocks`` recompute their forward in the backward instead of
    saving its activations. In place: each gets an instance ``forward``, so it keeps its name, hooks and state."""
    modules = dict(model.named_modules())
    for name in blocks:
        module = modules[name]
        module.forward = functools.partial(checkpoint, module.forward, use_reentrant=False)


def bf16_autocast(
    model: torch.nn.Module,
    optimizers: Optimizers,
    batch: Any,
    loss_fn: LossFn = surrogate_step,
    repeats: int = 3,
    allows: Allows | None = None,
) -> FixCost:
    """The forward and the loss under ``torch.autocast`` in bfloat16 on the model's device."""
    device = next((p.device.type for p in model.parameters()), "cpu")
    baseline = _variant(model, optimizers, batch, loss_fn)
    fixed = _variant(model, optimizers, batch, bf16_loss(loss_fn, device))
    return _compare("bf16-autocast", device, baseline, fixed, repeats, allows)


def bf16_loss(loss_fn: LossFn, device: str) -> LossFn:
    """``loss_fn`` with the forward and the loss under ``torch.autocast(device, dtype=torch.bfloat16)``."""

    def autocast_loss(m: torch.nn.Module, b: Any) -> torch.Tensor:
        with torch.autocast(device, dtype=torch.bfloat16):
            return loss_fn(m, b)

    return autocast_loss


def set_to_none(
    model: torch.nn.Module,
    optimizers: Optimizers,
    batch: Any,
    loss_fn: LossFn = surrogate_step,
    repeats: int = 3,
    allows: Allows | None = None,
) -> FixCost:
    """``zero_grad(set_to_none=True)`` against gradients zero-filled and kept between steps."""
    baseline = _variant(model, optimizers, batch, loss_fn, set_to_none=False)
    fixed = _variant(model, optimizers, batch, loss_fn)
    return _compare("set-to-none", "zero_grad(set_to_none=True)", baseline, fixed, repeats, allows)


def micro_batches(
    model: torch.nn.Module,
    optimizers: Optimizers,
    batch: Any,
    k: int,
    rows: int,
    dim: int = 0,
    loss_fn: LossFn = surrogate_step,
    repeats: int = 3,
    allows: Allows | None = None,
) -> FixCost:
    """``k`` micro-batches of ``rows // k`` with their gradients accumulated, against the whole batch of ``rows``
    (tensors whose dimension ``dim`` is ``rows`` are split; the rest go to every micro-batch)."""
    parts = split_rows(batch, rows, dim, k)
    fixed = _variant(model, optimizers, batch, loss_fn)
    fixed.batches = parts
    baseline = _variant(model, optimizers, batch, loss_fn)
    return _compare("micro-batches", f"{k} x {rows // k}", baseline, fixed, repeats, allows)


def accumulated(
    model: torch.nn.Module,
    optimizers: Optimizers,
    batch: Any,
    k: int,
    loss_fn: LossFn = surrogate_step,
    repeats: int = 3,
) -> FixCost:
    """``k`` micro-batches, each the whole ``batch``, their gradients accumulated (the peak of a step of ``k`` times
    the rows split into micro-batches of this batch's), against one step of ``batch``; the fixed side's seconds are
    per micro-batch, the baseline's rows."""
    fixed = _variant(model, optimizers, batch, loss_fn)
    fixed.batches = [batch] * k
    baseline = _variant(model, optimizers, batch, loss_fn)
    cost = _compare("micro-batches", f"{k} x the batch", baseline, fixed, repeats)
    return dataclasses.replace(cost, fixed=dataclasses.replace(cost.fixed, step_seconds=cost.fixed.step_seconds / k))


def split_rows(batch: Any, rows: int, dim: int, k: int) -> list[Any]:
    """``batch`` (of ``rows`` rows along ``dim``) as ``k`` equal micro-batches, views of it."""
    if k < 1 or rows % k:
        raise ValueError(f"{rows} rows do not split into {k} equal micro-batches")
    return [_rows(batch, rows, dim, i * (rows // k), rows // k) for i in range(k)]


def _rows(batch: Any, rows: int, dim: int, start: int, length: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.narrow(dim, start, length) if batch.dim() > dim and batch.shape[dim] == rows else batch
    if isinstance(batch, (list, tuple)):
        items = [_rows(b, rows, dim, start, length) for b in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    if isinstance(batch, dict):
        return type(batch)((key, _rows(v, rows, dim, start, length)) for key, v in batch.items())
    return batch


def eager_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module a ``torch.compile`` wrapper runs (its ``_orig_mod``), else ``model``: the copies run eagerly, and
    their submodules are named as the script names them (``transformer.h.0``, not ``_orig_mod.transformer.h.0``)."""
    original = getattr(model, "_orig_mod", None)
    return original if isinstance(original, torch.nn.Module) else model


def _variant(
    model: torch.nn.Module, optimizers: Optimizers, batch: Any, loss_fn: LossFn, set_to_none: bool = True
) -> _Variant:
    # One deepcopy of both: its memo maps each parameter to one copy, which the copied optimizers then hold.
    model_copy, optimizer_copies = copy_for_trial((eager_module(model), list(optimizers)))
    return _Variant(model_copy, optimizer_copies, [batch], loss_fn, set_to_none)


def _compare(
    fix: str, detail: str, baseline: _Variant, fixed: _Variant, repeats: int, allows: Allows | None = None
) -> FixCost:
    # warm-up: the optimizer's state exists and, when kept, the gradients; its steps say what the rest will cost
    warm = [_timed(variant) for variant in (baseline, fixed)]
    if allows is not None and not allows((1 + repeats) * sum(warm)):
        raise OverBudget(
            f"{fix}: a step took {warm[1] * 1e3:.0f} ms against {warm[0] * 1e3:.0f} ms as the script runs, more "
            "than the what-if budget left could hold for its peak and its rounds"
        )
    memories = [_memory(v) for v in (baseline, fixed)]
    seconds = [float("inf"), float("inf")]
    for _ in range(repeats):
        for i, variant in enumerate((baseline, fixed)):
            seconds[i] = min(seconds[i], _timed(variant))
        # More rounds tell a few percent from noise; a fix several times slower (bf16 where the CPU has no bf16
        # instructions) is that after one, and each more round costs another of its slow steps.
        if max(seconds) > CLEARLY_APART * min(seconds):
            break
    return FixCost(fix, detail, _cost(memories[0], seconds[0]), _cost(memories[1], seconds[1]))


def _memory(variant: _Variant) -> StepMemory:
    return measure_step(
        variant.model, variant.optimizers, variant.batches, variant.loss_fn, set_to_none=variant.set_to_none
    )


def _cost(memory: StepMemory, seconds: float) -> Cost:
    peak = memory.allocator_peak_bytes if memory.allocator_peak_bytes is not None else memory.peak_bytes
    return Cost(peak, seconds, memory)


def train_step(
    model: torch.nn.Module, optimizers: Optimizers, batches: Sequence[Any], loss_fn: LossFn, set_to_none: bool = True
) -> None:
    """One optimizer step: ``zero_grad``, forward and backward of ``loss_fn(model, batch) / len(batches)`` for each
    micro-batch, then every optimizer's step."""
    for opt in optimizers:
        opt.zero_grad(set_to_none=set_to_none)
    for batch in batches:
        (loss_fn(model, batch) / len(batches)).backward()
    for opt in optimizers:
        opt.step()


def _step(variant: _Variant) -> None:
    # Eager, as measure_step's peak is: a copy of a compiled model would compile again for every fix and its
    # baseline (airbench's max-autotune copies: 21 s a first step, and no fix fitted the budget).
    with torch.compiler.set_stance("force_eager"):
        train_step(variant.model, variant.optimizers, variant.batches, variant.loss_fn, variant.set_to_none)


def _timed(variant: _Variant) -> float:
    """Seconds for one step, the device's queued work included."""
    device = next((p.device for p in variant.model.parameters()), torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    _step(variant)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started
