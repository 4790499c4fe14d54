"""The process group as torchrun sets it up: world size, rank, initialisation, small collectives.

Every helper here is safe to call in a single process: without an initialised group the
collectives return their input unchanged, so callers need no ``if distributed:`` branches.
"""

from __future__ import annotations

import atexit
import os
import time
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "world_size",
    "rank",
    "local_rank",
    "is_launched",
    "is_initialized",
    "init_process_group",
    "is_rank_zero",
    "barrier",
    "broadcast_object",
    "gather_objects",
    "all_reduce_sum",
]


def is_launched() -> bool:
    """Whether a launcher (torchrun, turbotrain launch) set up the environment for this process."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    if is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", 1))


def rank() -> int:
    if is_initialized():
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
    if backend == "gloo":
        atexit.register(_let_gloo_workers_finish)


# Seconds to wait at exit; a worker thread descheduled for longer than this still races the shutdown.
GLOO_EXIT_GRACE_S = 0.25


def _let_gloo_workers_finish() -> None:
    """Give gloo's worker threads the GIL before the interpreter shuts down.

    A gloo worker thread drops its reference to a finished collective (and so to the
    collective's tensors, which needs the GIL) a moment *after* the caller has seen the
    collective finish. When a script ends right after a collective and the interpreter is
    already finalizing by then, that thread cannot take the GIL and the process aborts with
    "terminate called without an active exception" (torch 2.13; pytorch/pytorch#179291):
    about 1 run in 15 on a loaded 2-core machine here. Sleeping releases the GIL to them.
    Neither destroy_process_group (it does not join the threads while FSDP's device mesh
    still holds the group) nor a barrier (its work keeps the previous one alive) avoids it.
    """
    time.sleep(GLOO_EXIT_GRACE_S)


def barrier() -> None:
    if is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` as rank ``src`` has it, on every rank."""
    if not is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj: Any, dst: int = 0) -> list[Any] | None:
    """Every rank's ``obj`` (in rank order) on rank ``dst``; None on the other ranks."""
    if not is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sum of ``values`` over all ranks, in one collective (float64 on ``device``)."""
    if not is_initialized() or dist.get_world_size() == 1:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def all_reduce_max_(tensor: torch.Tensor) -> None:
    """In place: the largest value over all ranks (asynchronous to the host on a GPU)."""
    if is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
