"""``tt.setup``: the Plan applied to a loop the user keeps writing themselves.

    model, optimizer, loader = tt.setup(model, optimizer, loader, plan)
    for inputs, targets in loader:              # batches arrive on the device
        loss = loss_fn(model(inputs), targets)  # forward runs under the plan's autocast
        optimizer.backward(loss)                # scaling, accumulation, no_sync
        optimizer.step()                        # steps once per accumulation window

The returned model forwards to the (compiled / DDP-wrapped) model under autocast and hands
out the original module's ``state_dict``; the returned optimizer forwards everything else
(``param_groups``, ``state_dict``, ...) to the original optimizer, so schedulers built on the
original keep working.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from .config import ConfigError
from .data.pipeline import read_ahead
from .plan import Plan
from .runtime import Runtime, prepare
from .speedups.set_to_none import zero_grad

__all__ = ["setup", "SetupModel", "SetupOptimizer"]


class SetupModel(nn.Module):
    """Calls the prepared model under the plan's autocast; state_dict is the user's module's."""

    def __init__(self, runtime: Runtime):
        super().__init__()
        self._rt = runtime
        self.module = runtime.module  # registered: .parameters(), .train(), .to() reach the user's module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self._rt.autocast():
            return self._rt.model(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)


class SetupOptimizer:
    """The user's optimizer plus ``backward(loss)`` and an accumulation-aware ``step()``."""

    def __init__(self, optimizer: torch.optim.Optimizer, runtime: Runtime):
        self.optimizer = optimizer
        self._rt = runtime
        self._micro = 0

    @property
    def is_last_micro_batch(self) -> bool:
        """Whether the next ``backward`` completes an accumulation window."""
        return (self._micro + 1) % self._rt.accum_steps == 0

    def backward(self, loss: torch.Tensor) -> None:
        rt = self._rt
        with rt.no_sync(not self.is_last_micro_batch):
            rt.backward(loss / rt.accum_steps if rt.accum_steps > 1 else loss)
        self._micro += 1

    def step(self) -> bool:
        """Step (and drop the gradients) once per accumulation window; True when it stepped."""
        if self._micro % self._rt.accum_steps:
            return False
        self._rt.optimizer_step(self.optimizer)
        self._rt.end_step()
        return True

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        zero_grad(self.optimizer, self._rt.set_to_none if set_to_none is None else set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def setup(
    model: nn.Module, optimizer: torch.optim.Optimizer, loader: Iterable | None = None, plan: Plan | None = None
) -> tuple[SetupModel, SetupOptimizer, Iterable | None]:
    """Apply ``plan`` to the model, the optimizer and the loader of a hand-written loop."""
    rt = prepare(model, optimizer, plan)
    if rt.pipeline is not None:
        raise ConfigError(
            "tt.setup: under strategy='pipeline' a schedule runs the forward and backward of every micro-batch, so "
            "a loop of your own calls it instead of model(inputs): runtime = tt.prepare(model, optimizer, plan); "
            "runtime.pipeline.configure(loss_fn, split_points); then per batch loss = "
            "runtime.pipeline.train_step((inputs, targets)); optimizer.step(); optimizer.zero_grad() "
            "(docs/launch.md, 'Pipeline parallelism')."
        )
    prepared_loader = None
    if loader is not None:
        prepared_loader = rt.device_batches(read_ahead(rt.rebuild_loader(loader)))  # data/pipeline.py's order
    return SetupModel(rt), SetupOptimizer(optimizer, rt), prepared_loader
