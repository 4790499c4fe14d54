"""``prepare``: apply a Plan to a model, its optimizers and loaders; the Runtime the loop uses.

``prepare`` walks the registry in order. Each active entry either applies (mutating the
Runtime: wrapping the model, setting the autocast dtype, adding loader overrides, ...) or
is skipped with one log line saying why. The Runtime then offers the handful of operations
a training step needs (autocast, backward, optimizer step, batches on the device) so the
Trainer's hot loop and ``tt.setup``'s helpers share one implementation.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .data import pipeline
from .data.loader import rebuild_loader
from .data.transfer import move_batch
from .hardware import Hardware, detect, resolve_device
from .plan import Plan
from .speedups.set_to_none import zero_grad

__all__ = ["Runtime", "prepare"]

log = logging.getLogger("turbotrain")

# One reusable no-op context: the hot loop enters it up to twice per micro-batch.
_NULL = contextlib.nullcontext()


@dataclass(eq=False)
class Runtime:
    plan: Plan
    hardware: Hardware
    device: torch.device
    module: nn.Module  # the user's module: state_dict, train()/eval()
    model: nn.Module  # what forward calls (maybe DDP-wrapped and/or compiled)
    optimizers: list[torch.optim.Optimizer]
    autocast_dtype: torch.dtype | None = None
    cast_inputs: torch.dtype | None = None  # bf16-true: floating inputs in bf16
    scaler: Any = None  # torch.amp.GradScaler for fp16-mixed
    accum_steps: int = 1
    set_to_none: bool = True
    non_blocking: bool = False
    channels_last_inputs: bool = False
    device_prefetch: bool = False
    loader_overrides: dict[str, Any] = field(default_factory=dict)
    ddp: Any = None  # the DistributedDataParallel wrapper, if any
    pipeline: Any = None  # strategy='pipeline': launch.pipeline.PipelineRunner
    applied: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    loss_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None  # compile on a GPU
    _wrapped_losses: dict[Any, Callable[..., Any]] = field(default_factory=dict, repr=False)

    # -- the step --------------------------------------------------------------------------

    def wrap_loss(self, loss_fn: Callable[..., Any] | None) -> Callable[..., Any] | None:
        """``loss_fn`` as this plan runs it: compiled beside the model where the compile switch says so."""
        if loss_fn is None or self.loss_wrapper is None:
            return loss_fn
        if loss_fn not in self._wrapped_losses:
            self._wrapped_losses[loss_fn] = self.loss_wrapper(loss_fn)
        return self._wrapped_losses[loss_fn]

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return _NULL
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()

    def no_sync(self, skip_sync: bool) -> contextlib.AbstractContextManager:
        """Under DDP, skip the gradient all-reduce for micro-batches before the last one."""
        if skip_sync and self.ddp is not None:
            return self.ddp.no_sync()
        return _NULL

    def clip_gradients(self, optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, clear_grads: bool = True) -> None:
        """Step one optimizer (through the GradScaler under fp16) and drop its gradients (unless the caller
        clears them itself, elsewhere in the step)."""
        if self.scaler is not None:
            self.scaler.step(optimizer)
        else:
            optimizer.step()
        if clear_grads:
            zero_grad(optimizer, self.set_to_none)

    def clear_grads(self) -> None:
        for optimizer in self.optimizers:
            zero_grad(optimizer, self.set_to_none)

    def end_step(self) -> None:
        """Once per training step, after every optimizer stepped: adjust the loss scale."""
        if self.scaler is not None:
            self.scaler.update()

    # -- batches -----------------------------------------------------------------------------

    @property
    def moves_batches(self) -> bool:
        """Whether batches need any per-batch work (a copy, a layout or dtype change)."""
        return self.device.type != "cpu" or self.channels_last_inputs or self.cast_inputs is not None

    def to_device(self, batch: Any) -> Any:
        """The batch on the training device, in the layout and dtype the plan asks for."""
        return move_batch(
            batch,
            self.device,
            non_blocking=self.non_blocking,
            channels_last=self.channels_last_inputs,
            float_dtype=self.cast_inputs,
        )

    def device_batches(self, loader: Iterable) -> Iterable:
        """Iterate ``loader`` with batches already on the device (prefetched when planned)."""
        return pipeline.device_batches(
            loader, self.to_device, self.device, moves=self.moves_batches, prefetch=self.device_prefetch
        )

    def rebuild_loader(self, loader: Any, **extra: Any) -> Any:
        """The loader with the plan's loader switches (workers, pinning, batch size) applied."""
        overrides = {**self.loader_overrides, **extra}
        if not overrides:
            return loader
        return rebuild_loader(loader, **overrides)

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def _as_list(optimizers) -> list[torch.optim.Optimizer]:
    if optimizers is None:
        return []
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    opts = list(optimizers)
    for i, opt in enumerate(opts):
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"optimizers[{i}] is a {type(opt).__name__}, not a torch.optim.Optimizer.")
    return opts


def prepare(
    model: nn.Module, optimizers=None, plan: Plan | None = None, on_skip: Callable[[str, str], None] | None = None
) -> Runtime:
    """Apply ``plan`` to ``model`` and ``optimizers`` (in place where possible) and return the Runtime.

    Parameters stay the same ``nn.Parameter`` objects, so optimizers (and schedulers built on
    them) keep working. Switches the hardware cannot honour are skipped with one log line.
    """
    from .speedups.registry import all_speedups

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    plan = plan or Plan()
    device = resolve_device(plan.device)
    hw = detect(device)
    if plan.strategy != "pipeline":  # a pipeline materialises each stage's layers on its own process only
        model.to(device)  # in place: the optimizer's Parameter objects stay valid
    rt = Runtime(
        plan=plan,
        hardware=hw,
        device=device,
        module=model,
        model=model,
        optimizers=_as_list(optimizers),
        accum_steps=plan.grad_accum_steps,
        set_to_none=plan.set_to_none,
    )
    for entry in all_speedups():
        if not entry.active(plan):
            continue
        reason = entry.requires(hw, plan)
        if reason is not None:
            rt.skipped.append((entry.name, reason))
            (on_skip or _log_skip)(entry.name, reason)
            continue
        entry.apply(rt)
        rt.applied.append(entry.name)
    return rt


def _log_skip(name: str, reason: str) -> None:
    log.warning("turbotrain: %s skipped: %s", name, reason)
