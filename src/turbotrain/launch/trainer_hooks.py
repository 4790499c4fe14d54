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
* resume: rank 0 picks the newest complete checkpoint and every rank loads that one; a sharded
  folder only once the manifest's hashes cover it, its ``.metadata`` read by an unpickler that
  knows DCP's metadata classes and nothing else, every other pickle with ``weights_only``.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
from collections.abc import Iterator, Mapping
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
        ckpt.own_directory(directory, create=True)  # every rank, before any writes: none waits for a refusal
        positions = tdist.gather_objects(state["position"])
        folders: tuple[str, ...] = ()
        if self.sharded:
            fsdp.save_sharded(self.module, self.optimizers, _sharded_dir(directory, step))
            folders = (_sharded_dir(directory, step).name,)
            state = {**state, "model": None, "optimizers": None, "sharded": folders[0]}
        path = None
        if self.rank == 0:
            # The step file (and its manifest, hashing every shard) is the commit; the shards were complete before it.
            path = ckpt.save_checkpoint({**state, "positions": positions}, directory, step, folders)
            ckpt.prune_checkpoints(directory, keep)
            _remove_stale_sharded(directory)
        tdist.barrier()  # nobody trains past a checkpoint before it is committed
        return path

    def find_checkpoint(self, directory: str) -> tuple[Path, dict[str, Any]] | None:
        """The newest complete checkpoint, chosen by rank 0 and loaded by every rank."""
        found, refusal = None, None
        if self.rank == 0:
            try:
                ckpt.own_directory(directory, create=False)
                ckpt.clean_temporary_files(directory)
                _remove_stale_sharded(directory)
                found = ckpt.latest_checkpoint(directory)
            except (ckpt.CheckpointError, ConfigError) as exc:
                refusal = exc  # told to every rank below: none waits for a broadcast that never comes
        step = tdist.broadcast_object(str(refusal) if refusal else None if found is None else int(found[1]["step"]))
        if refusal is not None:
            raise refusal
        if isinstance(step, str):
            raise ConfigError(f"rank 0 cannot resume: {step}")
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
        """Model and optimizer state from a checkpoint written with any strategy and number of processes.

        Checked against the model and optimizers first: one that does not fit changes nothing.
        """
        if state.get("sharded"):
            # load_checkpoint verified it: a plain folder name of checkpoint_dir, every file hash-checked.
            load_sharded(self.module, self.optimizers, Path(path).parent / state["sharded"])
            return
        if self.sharded:
            raise ConfigError(
                f"checkpoint {path} was written without FSDP, and this run shards the model with FSDP; "
                "resume it with the strategy that wrote it."
            )
        problems = weight_mismatches(self.module, self.optimizers, state["model"], state["optimizers"])
        if problems:
            raise ckpt.CheckpointMismatchError(path, problems)
        self.module.load_state_dict(state["model"])
        for opt, opt_state in zip(self.optimizers, state["optimizers"], strict=True):
            opt.load_state_dict(opt_state)

    def position(self, state: dict[str, Any]) -> dict[str, Any]:
        return position_for_rank(state, self.rank, self.world)


# -- does a checkpoint fit this run ---------------------------------------------------------------


def _listed(names: list[str], limit: int = 4) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _shapes(state: Mapping[str, Any]) -> dict[str, tuple[int, ...] | None]:
    return {k: tuple(v.shape) if isinstance(v, torch.Tensor) else None for k, v in state.items()}


def _mismatches(saved: Mapping[str, Any], own: Mapping[str, Any], what: str) -> list[str]:
    """Missing, unexpected and differently shaped entries; both map a key to its shape (None: not a tensor)."""
    problems = []
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    shapes = [
        f"{k} is {list(saved[k])} there, {list(own[k])} here"
        for k in own
        if k in saved and None not in (saved[k], own[k]) and saved[k] != own[k]
    ]
    if missing:
        problems.append(f"{what} has {_listed(missing)}, which the checkpoint lacks")
    if unexpected:
        problems.append(f"the checkpoint has {_listed(unexpected)}, which {what} lacks")
    if shapes:
        problems.append(f"shapes differ: {_listed(shapes, 3)}")
    return problems


def weight_mismatches(
    module: nn.Module, optimizers: list[torch.optim.Optimizer], model_state: Any, optimizer_states: Any
) -> list[str]:
    """How a (non-sharded) checkpoint's model and optimizer state differ from ``module`` and ``optimizers``."""
    if not isinstance(model_state, Mapping) or not isinstance(optimizer_states, list):
        return ["it holds no model or optimizer state (it was not written by a Trainer)"]
    problems = _mismatches(_shapes(model_state), _shapes(module.state_dict()), "the model")
    if len(optimizer_states) != len(optimizers):
        return [*problems, f"it holds {len(optimizer_states)} optimizer(s), this run has {len(optimizers)}"]
    for i, (opt, saved) in enumerate(zip(optimizers, optimizer_states)):
        sizes = [len(g["params"]) for g in opt.param_groups]
        try:
            groups, state = saved["param_groups"], saved["state"]
            saved_sizes = [len(g["params"]) for g in groups]
        except (TypeError, KeyError):
            return [*problems, f"optimizer {i}'s saved state is not an optimizer's"]
        if saved_sizes != sizes or not isinstance(state, Mapping):
            problems.append(f"optimizer {i} has parameter groups of {sizes} parameters, the checkpoint {saved_sizes}")
            continue
        for group, saved_group in zip(opt.param_groups, groups):
            for param, key in zip(group["params"], saved_group["params"]):
                values = state.get(key)
                for name, value in values.items() if isinstance(values, Mapping) else ():
                    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                        # One is enough to tell: the optimizer was built for another model.
                        return [
                            *problems,
                            f"optimizer {i}'s {name} for a parameter of shape {list(param.shape)} is "
                            f"{list(value.shape)} in the checkpoint",
                        ]
    return problems


# -- sharded checkpoints (torch.distributed.checkpoint), read as data only ------------------------

# What DCP's ``.metadata`` pickle holds (torch 2.13): its dataclasses, torch.Size, dtypes and layouts by
# name, and the path it was saved to. Unpickling anything else could run code: it is refused.
_METADATA_GLOBALS = {
    *(
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a lookup of torch's layouts by name
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a sharded checkpoint's metadata")


def read_sharded_metadata(folder: Path) -> Any:
    """The ``.metadata`` of a sharded checkpoint folder, unpickled with DCP's metadata classes only, and
    checked to read nothing but plain files of ``folder`` itself."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    path = folder / ".metadata"
    try:
        with open(path, "rb") as fh:
            metadata = _MetadataUnpickler(fh).load()
    except Exception as exc:  # noqa: BLE001 - unpickling junk raises many types; one error type out
        raise ckpt.CheckpointError(
            path, f"is not a sharded checkpoint's metadata ({type(exc).__name__}: {exc}); nothing else is unpickled"
        ) from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, Mapping):
        raise ckpt.CheckpointError(path, "is not a sharded checkpoint's metadata")
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if (
            not isinstance(info, _StorageInfo)
            or not isinstance(name, str)
            or os.sep in name
            or name in ("", ".", "..")
            or not (folder / name).is_file()
            or info.transform_descriptors
        ):
            raise ckpt.CheckpointError(path, f"names {name!r}, which is not a file of its own folder {folder}")
    return metadata


def _tensor_leaves(value: Any, key: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of a nested state dict under DCP's flattened keys ("optimizers.state.fc.weight.exp_avg")."""
    if isinstance(value, torch.Tensor):
        yield key, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _tensor_leaves(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensor_leaves(v, f"{key}.{i}")


def _cause(exc: BaseException) -> BaseException:
    """The first process's error inside DCP's CheckpointException (which holds each one's, and a traceback)."""
    failures = getattr(exc, "failures", None)
    return next(iter(failures.values()))[0] if failures else exc


def load_sharded(module: nn.Module, optimizers: list[torch.optim.Optimizer], folder: Path) -> None:
    """Load a sharded checkpoint folder (``fsdp.save_sharded``) into ``module`` and ``optimizers``,
    resharding as needed, once it is checked to fit them. load_checkpoint hash-checked every file of it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not (folder / ".metadata").is_file():
        raise ConfigError(
            f"sharded checkpoint {folder} is incomplete (no .metadata); every process must see the same "
            "checkpoint_dir (a shared filesystem when training on several nodes)."
        )
    metadata = read_sharded_metadata(folder)
    model_state, optim_state = get_state_dict(module, optimizers)
    state: dict[str, Any] = {"model": model_state, "optimizers": optim_state}
    own = {k[1:]: tuple(v.shape) for k, v in _tensor_leaves(state, "")}  # k[1:]: no leading "."
    # Only what this process loads: a pipeline's process holds its own stages of the whole saved model.
    saved = {
        k: tuple(md.size)
        for k, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata) and k in own
    }
    problems = _mismatches(saved, own, "this run")

    class Reader(dcp.FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            # The metadata read and checked above, not the file again: nothing is unpickled twice.
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class DataOnlyPlanner(dcp.DefaultLoadPlanner):
        def create_local_plan(self) -> Any:
            # Refused here, before any data is read, inside DCP's collective: every process hears of it.
            if problems:
                raise ckpt.CheckpointMismatchError(folder, problems)
            return super().create_local_plan()

        def load_bytes(self, read_item: Any, value: Any) -> None:
            # DefaultLoadPlanner unpickles these (param-group settings: lr, betas, ...) with weights_only=False.
            obj = torch.load(value, map_location="cpu", weights_only=True)
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)

    try:
        with fsdp._single_process_is_intended():
            dcp.load(
                state, storage_reader=Reader(folder), planner=DataOnlyPlanner(), no_dist=not tdist.is_initialized()
            )
    except (Exception, dcp.CheckpointException) as exc:  # noqa: BLE001 - DCP wraps each rank's error its own way
        cause = _cause(exc)
        if isinstance(cause, ckpt.CheckpointMismatchError):
            raise cause from None
        raise ckpt.CheckpointError(folder, f"could not be loaded ({ckpt.load_error(cause)})") from None
    set_state_dict(module, optimizers, model_state_dict=state["model"], optim_state_dict=state["optimizers"])
