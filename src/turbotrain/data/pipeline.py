"""One training loader, from the store to the device, composed here in the order data flows.

    source           the user's dataset (FileDataset, ParquetDataset, anything map-style or iterable)
      -> read-ahead  its files fetched ahead, N requests in flight, in the order the sampler gives
      -> sampler     each rank's share (DistributedSampler), an epoch that can resume at any batch
      -> DataLoader  the plan's settings: workers, pinning, batch size, persistent workers
      -> device      batches moved to the device, the next one prefetched on a side stream

A batch is drawn by the sampler, its files are already in flight (read-ahead wraps the final batch
sampler, so it sees exactly the order the DataLoader will ask for, skipped batches of a resumed epoch
left out), the DataLoader (or its workers) reads them from the cache, and the device stage moves the
result. :func:`training_loader` builds everything up to the DataLoader once per ``fit``;
:func:`device_batches` adds the last stage per epoch. The Trainer (through ``train.resumable`` and
``launch``'s rank coordinator) and ``tt.setup`` call these and nothing else.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Iterable

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from .loader import batch_sampler_of, rebuild_loader
from .prefetch import DeviceLoader
from .cache import DiskCache
from .files import FileDataset
from .readahead import ReadAheadBatches

__all__ = ["shard", "training_loader", "device_batches"]

log = logging.getLogger("turbotrain")


# -- sampler: each rank's share --------------------------------------------------------------


def _seed_of(loader: DataLoader) -> int:
    """The seed the user's shuffling is governed by (their generator's, else torch's global one)."""
    generator = getattr(loader.sampler, "generator", None) or loader.generator
    seed = generator.initial_seed() if generator is not None else torch.initial_seed()
    return seed % 2**63  # DistributedSampler adds the epoch to it


def shard(loader: Any, replicas: int | None = None, index: int | None = None) -> Any:
    """``loader`` with each rank reading its own 1/world_size of the data (map-style DataLoaders).

    Already-distributed samplers, iterable datasets (they shard themselves) and loaders that are
    not DataLoaders are returned as they are. Each rank keeps the loader's batch size, so the
    global batch is ``world_size * batch_size``. ``replicas`` and ``index`` split it among fewer
    readers instead (a pipeline's data-parallel replicas: every stage of one reads the same batches).
    """
    from .. import distributed as tdist

    world = tdist.world_size() if replicas is None else replicas
    if world == 1 or not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    sampler = loader.sampler
    if isinstance(sampler, DistributedSampler) or isinstance(
        getattr(loader.batch_sampler, "sampler", None), DistributedSampler
    ):
        return loader
    plain_shuffle = isinstance(sampler, RandomSampler) and not sampler.replacement and sampler._num_samples is None
    if loader.batch_size is None or not (plain_shuffle or isinstance(sampler, SequentialSampler)):
        log.warning(
            "turbotrain: the loader's %s is left as it is, so every one of the %d processes reads all of the "
            "data; shard it yourself (e.g. torch.utils.data.DistributedSampler) to split it",
            type(loader.batch_sampler if loader.batch_size is None else sampler).__name__,
            world,
        )
        return loader
    # Every rank must draw the same permutation: rank 0's seed decides.
    seed = tdist.broadcast_object(_seed_of(loader))
    distributed: DistributedSampler[int] = DistributedSampler(
        loader.dataset,
        num_replicas=world,
        rank=tdist.rank() if index is None else index,
        shuffle=plain_shuffle,
        seed=seed,
    )
    return rebuild_loader(loader, sampler=distributed)


# -- source -> read-ahead -> sampler -> DataLoader ---------------------------------------------


def training_loader(
    loader: Any,
    rebuild: Callable[..., Any],
    resumable: Callable[[Iterable[list[int]]], Any] | None = None,
    worker_init: Callable[[Callable[[int], None] | None, int], None] | None = None,
) -> tuple[Any, Any]:
    """The loader a training run iterates, and its resumable batch sampler (None when it has none).

    ``rebuild(loader, **extra)`` applies the plan's DataLoader settings (``Runtime.rebuild_loader``);
    ``resumable(batch_sampler)`` wraps the batch sampler so an epoch can start at any batch;
    ``worker_init(user_init, worker_id)`` runs first in every DataLoader worker.

    ``loader`` comes sharded already (the sampler stage): the launch's coordinator calls :func:`shard`,
    since only it knows which ranks read the same data (a pipeline's stages of one replica do).
    """
    planned = rebuild(loader)  # DataLoader: the plan's settings
    extra: dict[str, Any] = {}
    if worker_init is not None and isinstance(planned, DataLoader) and planned.num_workers > 0:
        extra["worker_init_fn"] = functools.partial(worker_init, planned.worker_init_fn)
    inner = batch_sampler_of(planned) if isinstance(planned, DataLoader) else None
    batches = resumable(inner) if inner is not None and resumable is not None else None
    if batches is not None:
        extra["batch_sampler"] = batches
    if extra:
        planned = rebuild(planned, **extra)
    return read_ahead(planned), batches  # read-ahead: the files, in the order just built


# -- DataLoader -> device ----------------------------------------------------------------------


def device_batches(
    loader: Iterable, to_device: Callable[[Any], Any], device: torch.device, *, moves: bool, prefetch: bool
) -> Iterable:
    """Iterate ``loader`` with batches on the device (``prefetch``: the next copy on a side stream)."""
    if not moves:
        return loader
    return DeviceLoader(loader, to_device, device, prefetch=prefetch)


def read_ahead(loader: Any) -> Any:
    """``loader`` rebuilt so its FileDataset's files are fetched ahead, in its sampler's order.

    Returns the loader unchanged when there is nothing to read ahead: not a DataLoader, not over a
    :class:`~turbotrain.data.FileDataset`, no batch sampler, already reading ahead, or workers
    without a cache all processes share (a directory or ``"shm"``; then each worker fetches its own
    batches, many at once).
    """
    if not isinstance(loader, DataLoader) or not isinstance(loader.dataset, FileDataset):
        return loader
    inner = batch_sampler_of(loader)
    if inner is None or isinstance(inner, ReadAheadBatches):
        return loader
    ds = loader.dataset
    if loader.num_workers > 0 and not isinstance(ds.cache, DiskCache):
        log.info(
            "turbotrain: no read-ahead for %r with %d DataLoader workers: it needs a cache every process "
            "sees (cache='/local/dir' or 'shm'); each worker fetches its own batches instead",
            ds,
            loader.num_workers,
        )
        return loader
    ds.enable_read_ahead()
    return rebuild_loader(loader, batch_sampler=ReadAheadBatches(inner, ds, keep_bytes=loader.num_workers == 0))
