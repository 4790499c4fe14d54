"""The process group as torchrun sets it up: world size, rank, initialisation, rank-0 helpers."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

__all__ = ["world_size", "rank", "local_rank", "is_launched", "init_process_group", "is_rank_zero"]


def is_launched() -> bool:
    """Whether a launcher (torchrun, turbotrain launch) set up the environment for this process."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def world_size() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", 1))


def rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def is_rank_zero() -> bool:
    return rank() == 0


def init_process_group(device: torch.device) -> None:
    """Join the group torchrun prepared: NCCL for CUDA, gloo for CPU. A no-op when already joined."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
