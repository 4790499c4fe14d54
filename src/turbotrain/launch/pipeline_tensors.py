"""This process's stages on real tensors: the user's own (moved to the device), or fresh ones initialised
by ``reset_parameters()`` for a model built on the meta device; the user's optimizers pointed at them."""

from __future__ import annotations

import torch
from torch import nn

from ..config import ConfigError

__all__ = ["set_tensor", "materialise_modules", "real_buffers", "repoint_optimizers"]


def set_tensor(module: nn.Module, fqn: str, value: torch.Tensor) -> None:
    owner_name, _, leaf = fqn.rpartition(".")
    owner = module.get_submodule(owner_name)
    if leaf in owner._parameters:
        owner._parameters[leaf] = value  # type: ignore[assignment]  # the tensor as it is, not a new nn.Parameter
    else:
        owner._buffers[leaf] = value


def materialise_modules(model: nn.Module, names: set[str], device: torch.device) -> None:
    """The named modules' own parameters real and on ``device``: moved, or (built on meta) made and initialised
    by the module's ``reset_parameters()``."""
    for module_name in sorted(names):
        module = model.get_submodule(module_name)
        own = list(module.parameters(recurse=False))
        if any(p.is_meta for p in own):
            module.to_empty(device=device, recurse=False)
            if not hasattr(module, "reset_parameters"):
                raise ConfigError(
                    f"{module_name or type(model).__name__} was built on the meta device and "
                    f"{type(module).__name__} has no reset_parameters() to initialise it on its stage."
                )
            module.reset_parameters()  # type: ignore[operator]  # hasattr above; Module.__getattr__ says Tensor
        elif any(p.device != device for p in own):
            module.to(device)  # these layers only


def real_buffers(model: nn.Module, names: list[str], device: torch.device) -> None:
    """These buffers on ``device``; one built on the meta device is refused (nothing can recompute its values)."""
    for name in names:
        buffer = model.get_buffer(name)
        if buffer.is_meta:
            raise ConfigError(
                f"buffer {name!r} was built on the meta device and nothing can recompute it on its "
                "stage; compute it in forward, or build the model for real."
            )
        if buffer.device != device:
            set_tensor(model, name, buffer.to(device))


def repoint_optimizers(optimizers: list[torch.optim.Optimizer], replaced: dict[nn.Parameter, nn.Parameter]) -> None:
    """Each group keeps only the parameters in ``replaced``, as their replacements: in place, so the groups'
    settings and any LR scheduler built on the optimizer stay valid."""
    for opt in optimizers:
        for group in opt.param_groups:
            group["params"][:] = [replaced[p] for p in group["params"] if p in replaced]
