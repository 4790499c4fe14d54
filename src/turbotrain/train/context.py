"""What a custom ``step_fn`` receives: the model and plan-aware backward/step operations.

Automatic optimization (the default): ``step_fn(ctx, batch)`` returns the loss and the
Trainer does backward, accumulation and the optimizer step.

Manual optimization (``manual_optimization=True``), for GANs and other several-optimizer
steps: ``step_fn`` calls ``ctx.backward(loss)`` and ``ctx.step(optimizer)`` itself.
With gradient accumulation, ``ctx.backward`` divides by the number of micro-batches and
skips the DDP gradient all-reduce until the last micro-batch, and ``ctx.step`` only steps
at the last one. ``with ctx.toggle(opt):`` freezes every parameter that ``opt`` does not
own, so no gradient is computed (nor synchronized) for the other model.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

import torch

__all__ = ["StepContext"]


class StepContext:
    def __init__(self, trainer, runtime):
        # A weak reference: a Trainer <-> context cycle would leave the Trainer (and the
        # DataLoader workers it owns) to the cycle collector, which shuts workers down slowly.
        self._trainer_ref = weakref.ref(trainer)
        self._rt = runtime
        self.model = runtime.model
        self.module = runtime.module
        self.optimizers = runtime.optimizers
        self.accum_steps = runtime.accum_steps
        self.is_last_micro_batch = True
        self.stepped = False  # whether any optimizer stepped in this training step

    @property
    def global_step(self) -> int:
        """Optimizer steps completed so far (not ``step``: that name is the method below)."""
        return self._trainer_ref().state.step

    def autocast(self) -> contextlib.AbstractContextManager:
        return self._rt.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        if self.accum_steps > 1:
            loss = loss / self.accum_steps
        with self._rt.no_sync(not self.is_last_micro_batch):
            self._rt.backward(loss)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step ``optimizer`` if this micro-batch ends an accumulation window; True when it stepped."""
        if not self.is_last_micro_batch:
            return False
        self.stepped = self._trainer_ref()._apply_optimizer(optimizer) or self.stepped
        return True

    @contextlib.contextmanager
    def toggle(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """Only ``optimizer``'s parameters require grad inside the block (restored after)."""
        own = {id(p) for g in optimizer.param_groups for p in g["params"]}
        frozen = [p for p in self.module.parameters() if p.requires_grad and id(p) not in own]
        for p in frozen:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in frozen:
                p.requires_grad_(True)
