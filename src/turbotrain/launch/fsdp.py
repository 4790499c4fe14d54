"""FSDP with PyTorch's current fully-sharded API (``torch.distributed.fsdp.fully_shard``)."""

from __future__ import annotations

import torch
from torch import nn

from .. import distributed as tdist


def shard_model(model: nn.Module, device: torch.device) -> nn.Module:
    """Shard every direct child that holds parameters, then the root (FSDP2 layout)."""
    from torch.distributed.fsdp import fully_shard

    tdist.init_process_group(device)
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child)
    fully_shard(model)
    return model
