"""Rebuilding a user's DataLoader with different settings (workers, pinning, batch size, sampler).

A DataLoader's settings cannot be changed after construction, so switches that touch the
loader build a new one from the old one's parts: same dataset, sampler, collate function,
worker init, generator, everything else as the user wrote it.
"""

from __future__ import annotations

import logging
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

__all__ = ["rebuild_loader", "LOADER_KEYS"]

log = logging.getLogger("turbotrain")

LOADER_KEYS = (
    "num_workers",
    "pin_memory",
    "persistent_workers",
    "batch_size",
    "batch_sampler",
    "prefetch_factor",
    "worker_init_fn",
    "sampler",
)


def _settings(loader: DataLoader) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
    )
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return kwargs


def rebuild_loader(loader: Any, **overrides: Any) -> Any:
    """A new DataLoader like ``loader`` with ``overrides`` applied.

    Allowed overrides: ``num_workers``, ``pin_memory``, ``persistent_workers``, ``batch_size``,
    ``batch_sampler`` (replaces the batching entirely), ``prefetch_factor``, ``worker_init_fn``,
    ``sampler`` (replaces the index order, e.g. by a DistributedSampler; batching stays). A value of None
    keeps the loader's own setting. Anything that is not a DataLoader is returned unchanged
    (with a log line), since there is nothing to rebuild.
    """
    unknown = set(overrides) - set(LOADER_KEYS)
    if unknown:
        raise TypeError(f"rebuild_loader: unknown setting(s) {sorted(unknown)}; allowed: {', '.join(LOADER_KEYS)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if not overrides:
        return loader
    if not isinstance(loader, DataLoader):
        log.warning(
            "turbotrain: loader settings %s not applied: the loader is a %s, not a torch DataLoader",
            sorted(overrides),
            type(loader).__name__,
        )
        return loader

    kwargs = _settings(loader)
    batch_size = overrides.pop("batch_size", None)
    batch_sampler = overrides.pop("batch_sampler", None)
    sampler = overrides.pop("sampler", None)
    kwargs.update(overrides)

    if batch_sampler is not None:
        kwargs["batch_sampler"] = batch_sampler
    elif isinstance(loader.dataset, IterableDataset):
        kwargs["batch_size"] = batch_size or loader.batch_size
        kwargs["drop_last"] = loader.drop_last
    elif loader.batch_size is None and batch_size is not None:
        if loader.batch_sampler is None:
            raise ValueError(
                "batch_size cannot be set: this DataLoader does no batching (batch_size=None); "
                "its dataset yields whole batches."
            )
        raise ValueError(
            "batch_size cannot be set: this DataLoader uses a custom batch_sampler "
            f"({type(loader.batch_sampler).__name__}); change the batch size there."
        )
    elif loader.batch_size is None:
        kwargs["batch_sampler"] = loader.batch_sampler
        if loader.batch_sampler is None:
            kwargs["batch_size"] = None
            kwargs["sampler"] = loader.sampler
    else:
        kwargs["sampler"] = sampler if sampler is not None else loader.sampler
        kwargs["batch_size"] = batch_size or loader.batch_size
        kwargs["drop_last"] = loader.drop_last

    if kwargs["num_workers"] == 0:
        # These two are only legal with worker processes.
        kwargs["prefetch_factor"] = None
        kwargs["persistent_workers"] = False
    return DataLoader(loader.dataset, **kwargs)


def batch_sampler_of(loader: DataLoader):
    """The loader's batch sampler, or None when it does not batch indices (iterable datasets)."""
    if isinstance(loader.dataset, IterableDataset):
        return None
    if loader.batch_sampler is not None:
        return loader.batch_sampler
    return None
