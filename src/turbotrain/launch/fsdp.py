"""FSDP with PyTorch's current fully-sharded API (``torch.distributed.fsdp.fully_shard``, "FSDP2").

Three things differ from DDP and are handled here:

* ``fully_shard`` replaces every parameter by a new ``nn.Parameter`` holding a DTensor shard,
  so an optimizer built before sharding points at the old, full parameters. Instead of
  building a new optimizer (which would orphan the user's reference to it and every LR
  scheduler built on it), :func:`rebind_optimizer` swaps the parameters inside the user's
  own optimizer, group by group, keeping every group setting.
* gradient accumulation without communication is ``set_requires_gradient_sync(False)``,
  not ``no_sync()``: :class:`GradientSync` offers the ``no_sync()`` the Runtime calls.
* checkpoints go through ``torch.distributed.checkpoint`` (each rank writes its shards;
  loading reshards, so a run can resume on a different number of processes).
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from .. import distributed as tdist
from ..config import ConfigError

__all__ = [
    "shard_model",
    "rebind_optimizer",
    "GradientSync",
    "is_sharded",
    "save_sharded",
    "load_sharded",
    "full_state_dict",
]

# Containers whose elements are the natural sharding units (transformer blocks, stages).
_CONTAINERS = (nn.ModuleList, nn.ModuleDict)


def _has_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _shard_units(model: nn.Module) -> Iterator[nn.Module]:
    """Direct children with parameters; the elements of ModuleList/ModuleDict children instead of the list."""
    for child in model.children():
        if isinstance(child, _CONTAINERS):
            yield from (m for m in child.children() if _has_params(m))
        elif _has_params(child):
            yield child


def shard_model(model: nn.Module, device: torch.device) -> nn.Module:
    """Shard each unit (a child with parameters, or each block of a ModuleList), then the root.

    Returns ``model`` itself (``fully_shard`` changes it in place). Its parameters are new
    objects afterwards: see :func:`rebind_optimizer`.
    """
    from torch.distributed.fsdp import fully_shard

    tdist.init_process_group(device)
    for unit in list(_shard_units(model)):
        fully_shard(unit)
    fully_shard(model)
    return model


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def rebind_optimizer(optimizer: torch.optim.Optimizer, replaced: dict[nn.Parameter, nn.Parameter]) -> None:
    """Point ``optimizer`` at the sharded parameters, in place.

    ``replaced`` maps each old parameter to its sharded successor. Param groups keep their
    settings (lr, weight decay, ...) and their order; the list objects are updated in place
    because some optimizers (LBFGS) keep a reference to a group's list. State is keyed by
    parameter, so an optimizer that already stepped cannot be rebound: its state tensors
    have the full shape, not the shard's.
    """
    if any(optimizer.state.values()):
        raise ConfigError(
            f"{type(optimizer).__name__} has already stepped (it holds state), and FSDP replaces the model's "
            "parameters by shards: that state cannot follow them. Build the Trainer (or call tt.prepare) before "
            "the first optimizer step, or resume the state from a checkpoint with fit(resume=True)."
        )
    for group in optimizer.param_groups:
        group["params"][:] = [replaced.get(p, p) for p in group["params"]]


@contextlib.contextmanager
def _sync_off(module) -> Iterator[None]:
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


class GradientSync:
    """The ``no_sync()`` of DDP, for an FSDP2 module (what ``Runtime.no_sync`` calls)."""

    def __init__(self, module: nn.Module):
        self.module = module

    def no_sync(self) -> contextlib.AbstractContextManager:
        return _sync_off(self.module)


def apply_to_runtime(rt) -> None:
    """Shard ``rt.module`` and move every optimizer onto the shards (the strategy switch's 'fsdp')."""
    before = dict(rt.module.named_parameters())
    shard_model(rt.module, rt.device)
    after = dict(rt.module.named_parameters())
    replaced = {before[name]: after[name] for name in before if name in after and after[name] is not before[name]}
    for optimizer in rt.optimizers:
        rebind_optimizer(optimizer, replaced)
    rt.model = rt.module
    rt.ddp = GradientSync(rt.module)  # Runtime.no_sync only needs an object with no_sync()


# -- checkpoints (torch.distributed.checkpoint) ----------------------------------------------


@contextlib.contextmanager
def _single_process_is_intended() -> Iterator[None]:
    """DCP warns whenever it runs without a process group; for us that is a supported case, not a mistake."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def save_sharded(module: nn.Module, optimizers: list[torch.optim.Optimizer], path: Path) -> None:
    """Every rank writes its shards of the model and optimizer state under ``path`` (a directory).

    DCP writes its ``.metadata`` last: a directory without it is incomplete.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(module, optimizers)
    with _single_process_is_intended():
        dcp.save(
            {"model": model_state, "optimizers": optim_state},
            checkpoint_id=str(path),
            no_dist=not tdist.is_initialized(),
        )


def load_sharded(module: nn.Module, optimizers: list[torch.optim.Optimizer], path: Path) -> None:
    """Load a :func:`save_sharded` checkpoint into ``module`` and ``optimizers``, resharding as needed.

    Works for any layout of the current run: FSDP on any number of processes, DDP, or one
    process without a process group.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not (path / ".metadata").is_file():
        raise ConfigError(
            f"sharded checkpoint {path} is incomplete (no .metadata); every process must see the same "
            "checkpoint_dir (a shared filesystem when training on several nodes)."
        )
    model_state, optim_state = get_state_dict(module, optimizers)
    state: dict[str, Any] = {"model": model_state, "optimizers": optim_state}
    with _single_process_is_intended():
        dcp.load(state, checkpoint_id=str(path), no_dist=not tdist.is_initialized())
    set_state_dict(module, optimizers, model_state_dict=state["model"], optim_state_dict=state["optimizers"])


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights as plain CPU tensors, on every rank (an all-gather for FSDP)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not is_sharded(module):
        return {k: v.detach().cpu() for k, v in module.state_dict().items()}
    # Not cpu_offload: with a full state dict it would keep the result on rank 0 only.
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().cpu() for k, v in state.items()}  # type: ignore[union-attr]  # a model's: all tensors


def remove_sharded(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
