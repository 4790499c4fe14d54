"""What the Trainer does differently when several processes train together (DDP or FSDP).

The Trainer calls one :class:`RankCoordinator` at a handful of moments; in a single process
every call returns its input unchanged, so the Trainer has no ``if distributed:`` branches.

* data: map-style loaders get a ``DistributedSampler`` (shuffled like the user's loader,
  with the same seed on every rank; the Trainer's epoch source calls ``set_epoch``);
* metrics: the training loss is averaged and the throughput summed across ranks, once per
  *logging* event (never per step); validation sums loss and sample counts across ranks;
* checkpoints: every rank's data position and random state are gathered (so a resumed run
  continues every rank's exact stream), FSDP shards are written by every rank through
  ``torch.distributed.checkpoint``, rank 0 commits, and nobody trains past a checkpoint
  before it is committed;
* resume: rank 0 picks the newest complete checkpoint and every rank loads that one.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import distributed as tdist
from ..config import ConfigError
from ..data import pipeline
from ..train import checkpoint as ckpt
from . import fsdp

__all__ = ["RankCoordinator", "shard_loader", "position_for_rank"]

log = logging.getLogger("turbotrain")

_SHARDED_NAME = re.compile(r"^step-(\d{9})\.dcp$")


# -- data --------------------------------------------------------------------------------------

# Sharding is the sampler stage of the one loader pipeline (data/pipeline.py).
shard_loader = pipeline.shard


# -- positions: where each rank stands in its data stream ---------------------------------------


def position_for_rank(state: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """This rank's saved Position (as a dict); rescaled when the number of processes changed.

    With a DistributedSampler, optimizer step ``k`` of every rank together covers global samples
    ``[k*b*W, (k+1)*b*W)`` of the epoch's permutation, so ``batches_done`` converts between
    world sizes by ``old / new`` (exact when it divides, else rounded down: a few samples repeat).
    """
    positions = state.get("positions") or [state["position"]]
    old = len(positions)
    pos = dict(positions[rank] if rank < old else positions[0])
    if old != world:
        done, rest = divmod(pos["batches_done"] * old, world)
        log.warning(
            "turbotrain: resuming on %d process(es) from a checkpoint written by %d: the global batch "
            "changes with the number of processes%s",
            world,
            old,
            f"; {rest} batch(es) of the current epoch are trained again" if rest else "",
        )
        pos["batches_done"] = done
    return pos


# -- the coordinator ----------------------------------------------------------------------------


def _sharded_dir(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step-{step:09d}.dcp"


def _remove_stale_sharded(directory: str | Path) -> None:
    """Sharded directories whose committed step file is gone (pruned) or never came (a crash)."""
    directory = Path(directory)
    if not directory.is_dir():
        return
    committed = {p.name for p in ckpt.list_checkpoints(directory) if p.with_suffix(".json").exists()}
    for path in directory.iterdir():
        match = _SHARDED_NAME.match(path.name)
        if match and ckpt.checkpoint_path(directory, int(match.group(1))).name not in committed:
            fsdp.remove_sharded(path)


class RankCoordinator:
    """The Trainer's distributed behaviour (a pass-through in a single process)."""

    def __init__(self, module: nn.Module, optimizers: list[torch.optim.Optimizer], device: torch.device):
        self.module = module
        self.optimizers = optimizers
        self.device = device
        self.world = tdist.world_size() if tdist.is_initialized() else 1
        self.rank = tdist.rank() if tdist.is_initialized() else 0
        self.sharded = fsdp.is_sharded(module)

    # -- data and metrics ----------------------------------------------------------------

    def shard_loader(self, loader: Any) -> Any:
        return loader if self.world == 1 or loader is None else shard_loader(loader)

    def reduce_logged(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Mean training loss and summed throughput over ranks (a collective: every rank logs together)."""
        if self.world == 1:
            return metrics
        loss, rate = metrics.get("train_loss"), metrics.get("samples_per_s")
        sums = tdist.all_reduce_sum([loss or 0.0, loss is not None, rate or 0.0, rate is not None], self.device)
        out = dict(metrics)
        if sums[1]:
            out["train_loss"] = sums[0] / sums[1]
        if sums[3]:
            out["samples_per_s"] = sums[2] * self.world / sums[3]  # ranks without a rate yet count as average
        return out

    def agree_on_flag(self, flag: torch.Tensor) -> None:
        """Every rank takes the largest flag: one rank's NaN stops (or skips on) every rank, so none
        goes on alone into a collective the others never join."""
        tdist.all_reduce_max_(flag)

    def global_rate(self, rate: float | None) -> float | None:
        """All ranks' samples/s together; the last collective of ``fit``."""
        if self.world == 1:
            return rate
        return self.reduce_logged({"samples_per_s": rate}).get("samples_per_s")

    def sum_validation(self, total: torch.Tensor, count: int) -> tuple[torch.Tensor, int]:
        """Validation loss sum and sample count over every rank's shard."""
        if self.world == 1:
            return total, count
        summed = tdist.all_reduce_sum([float(total), float(count)], self.device)
        return torch.tensor(summed[0], dtype=torch.float64), int(summed[1])

    # -- checkpoints ---------------------------------------------------------------------

    def save_checkpoint(self, state: dict[str, Any], directory: str, step: int, keep: int) -> Path | None:
        """Commit ``state`` as step ``step``; returns the path on rank 0 (None elsewhere). Every rank calls it."""
        positions = tdist.gather_objects(state["position"])
        if self.sharded:
            fsdp.save_sharded(self.module, self.optimizers, _sharded_dir(directory, step))
            state = {**state, "model": None, "optimizers": None, "sharded": _sharded_dir(directory, step).name}
        path = None
        if self.rank == 0:
            # The step file (and its manifest) is the commit; FSDP shards were complete before it.
            path = ckpt.save_checkpoint({**state, "positions": positions}, directory, step)
            ckpt.prune_checkpoints(directory, keep)
            _remove_stale_sharded(directory)
        tdist.barrier()  # nobody trains past a checkpoint before it is committed
        return path

    def find_checkpoint(self, directory: str) -> tuple[Path, dict[str, Any]] | None:
        """The newest complete checkpoint, chosen by rank 0 and loaded by every rank."""
        found = None
        if self.rank == 0:
            ckpt.clean_temporary_files(directory)
            _remove_stale_sharded(directory)
            found = ckpt.latest_checkpoint(directory)
        step = tdist.broadcast_object(None if found is None else int(found[1]["step"]))
        if step is None or self.rank == 0:
            return found
        path = ckpt.checkpoint_path(directory, step)
        try:
            return path, ckpt.load_checkpoint(path)
        except ckpt.CheckpointError as exc:
            raise ckpt.CheckpointError(
                path,
                f"{exc.reason}. Rank 0 resumes from it, so every process must be able "
                "to read checkpoint_dir (shared storage when training on several "
                "nodes)",
            ) from None

    def load_weights(self, path: Path, state: dict[str, Any]) -> None:
        """Model and optimizer state from a checkpoint written with any strategy and number of processes."""
        if state.get("sharded"):
            fsdp.load_sharded(self.module, self.optimizers, Path(path).parent / state["sharded"])
            return
        if self.sharded:
            raise ConfigError(
                f"checkpoint {path} was written without FSDP, and this run shards the model with FSDP; "
                "resume it with the strategy that wrote it."
            )
        self.module.load_state_dict(state["model"])
        for opt, opt_state in zip(self.optimizers, state["optimizers"], strict=True):
            opt.load_state_dict(opt_state)

    def position(self, state: dict[str, Any]) -> dict[str, Any]:
        return position_for_rank(state, self.rank, self.world)
