"""A one-process job's process group, kept for the doctor's measurements after the script ends.

A script that trains through torch.distributed on one process (modded-nanogpt's single-GPU run: DDP, a Muon
optimizer that all-reduces its updates) destroys its process group as it ends. The doctor then steps copies of its
model and optimizers (the step's memory, the what-ifs), and a copy's collective fails with "Default process group
has not been initialized". While the script runs in the doctor's process, its ``destroy_process_group()`` of a
default group of one rank is put off until the doctor is done; every other call goes through, and a script that
initialises a group again after destroying one gets the real destroy first. A default group the script made and
left (the doctor stopped it before its end) is destroyed with the doctor's end too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .patcher import Patcher

__all__ = ["process_group_kept"]


@contextmanager
def process_group_kept() -> Iterator[None]:
    """While inside, the script's destroy of a one-rank default process group is put off to the exit, where a
    default group made inside is destroyed."""
    if not torch.distributed.is_available():
        yield
        return
    import torch.distributed.distributed_c10d as c10d

    real_destroy, real_init = c10d.destroy_process_group, c10d.init_process_group
    put_off: list[bool] = []

    def destroy(group: Any = None) -> None:
        if group is None and not put_off and c10d.is_initialized() and c10d.get_world_size() == 1:
            put_off.append(True)  # the default group of a one-process job: destroyed when the doctor is done
            return
        real_destroy(group)

    def init(*args: Any, **kwargs: Any) -> Any:
        if put_off:  # a new group after the one put off: the script expects that one gone
            put_off.clear()
            real_destroy()
        return real_init(*args, **kwargs)

    made_here = not c10d.is_initialized()
    patcher = Patcher()
    for owner in (torch.distributed, c10d):
        patcher.put(owner, "destroy_process_group", destroy)
        patcher.put(owner, "init_process_group", init)
    try:
        yield
    finally:
        patcher.restore()
        # The group the script made, its destroy put off or never reached (the doctor stopped the script first).
        if made_here and c10d.is_initialized():
            real_destroy()
