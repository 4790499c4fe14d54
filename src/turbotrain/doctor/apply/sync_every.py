"""Gradient accumulation without a sync per micro-batch, applied to a script that syncs every one: the job
what-if of ``accumulation-syncs`` (:class:`~..rank_change.RankChange` ``sync_every``).

Each training forward of a DDP model, or of an FSDP root, counts as a micro-batch; the ``every``-th since the last
optimizer step keeps its gradient sync, the others run as under DDP's ``no_sync()``, FSDP's
``set_requires_gradient_sync(False)`` or the older FSDP's ``no_sync()``. Each of them reads its flag in the backward
that follows the forward. Counting from the last optimizer step keeps one stray forward (a second view of the batch,
a step cut short) from shifting which micro-batch syncs for the rest of the run.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, cast

from ..record.patcher import Patcher

__all__ = ["sync_every"]


class _MicroBatches:
    """Training forwards of each model since the last optimizer step."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.counts: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def syncs(self, model: Any) -> bool:
        """Count a training forward of ``model``: whether its gradients are synchronized after its backward."""
        count = self.counts.get(model, 0) + 1
        self.counts[model] = count
        return count % self.every == 0

    def step_taken(self, *_: Any) -> None:
        self.counts.clear()


def _training_forward(model: Any) -> bool:
    """A forward whose backward will come: training mode, autograd on, and not a forward that activation
    checkpointing runs again inside the backward."""
    import torch

    in_backward = getattr(torch._C, "_current_graph_task_id", lambda: -1)() != -1
    return bool(model.training) and torch.is_grad_enabled() and not in_backward


def sync_every(patcher: Patcher, every: int) -> None:
    """Every DDP model and FSDP root of this process syncs its gradients once per ``every`` micro-batches."""
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook

    micro = _MicroBatches(every)
    # The count is Python state: a compiled model runs it eagerly rather than guarding on it.
    syncs = torch.compiler.disable(micro.syncs)
    patcher.defer(register_optimizer_step_post_hook(micro.step_taken).remove)

    def ddp_forward(forward: Callable[..., Any]) -> Callable[..., Any]:
        def forward_(model: Any, *args: Any, **kwargs: Any) -> Any:
            if _training_forward(model):
                model.require_backward_grad_sync = syncs(model)  # DDP reads it as the forward starts
            return forward(model, *args, **kwargs)

        return forward_

    patcher.replace(DistributedDataParallel, "forward", ddp_forward)
    _fsdp_roots(patcher, syncs)


def _fsdp_roots(patcher: Patcher, syncs: Callable[[Any], bool]) -> None:
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # a torch before FSDP2's public name: DDP only
        return
    depth = [0]  # FSDP modules called inside another's forward: only the outermost (the root) counts

    def counting(call: Callable[..., Any], set_sync: Callable[[Any, bool], None]) -> Callable[..., Any]:
        def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
            if depth[0] == 0 and _training_forward(module):
                set_sync(module, syncs(module))
            depth[0] += 1
            try:
                return call(module, *args, **kwargs)
            finally:
                depth[0] -= 1

        return __call__

    # FSDPModule sits before the original class in a sharded module's MRO: its __call__ is found first.
    patcher.put(
        FSDPModule,
        "__call__",
        counting(lambda module, *a, **k: super(FSDPModule, module).__call__(*a, **k), _fsdp2_sync),
    )
    patcher.replace(FullyShardedDataParallel, "__call__", lambda call: counting(call, _fsdp1_sync))


def _fsdp2_sync(root: Any, sync: bool) -> None:
    root.set_requires_gradient_sync(sync)  # the root and every sharded module under it


def _fsdp1_sync(root: Any, sync: bool) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel

    for module in root.modules():  # as no_sync() sets it: on every FSDP module under the root
        if isinstance(module, FullyShardedDataParallel):
            cast(Any, module)._sync_gradients = sync  # a flag FSDP reads, which its type does not declare
