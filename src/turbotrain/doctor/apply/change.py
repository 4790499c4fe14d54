"""A rank applies the job what-if's :class:`~..rank_change.RankChange` to itself before its script starts, and
the doctor reads back from the timed run's recordings what the ranks really trained with (:func:`observed`): a
what-if whose fix did not take (a script that overrides it) says so.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

from ..rank_change import RankChange
from ..record.patcher import Patcher
from .sync_every import sync_every

if TYPE_CHECKING:
    from ..record.recording import Recording

__all__ = ["APPLIED", "apply_change", "observed"]


def apply_change(change: RankChange) -> Patcher:
    """Make this process train with ``change`` (a rank, before its script runs); the patcher undoes it."""
    patcher = Patcher()
    if change.threads is not None:
        _force_threads(patcher, change.threads)
    if change.save_every is not None:
        _thin_saves(patcher, change.save_every, change.save_at)
    if change.loader_workers is not None:
        from torch.utils.data import DataLoader

        forced = {"num_workers": change.loader_workers, "persistent_workers": True}
        patcher.replace(DataLoader, "__init__", lambda init: _with_keywords(init, forced, _map_style))
    if change.fsdp:
        _force_fsdp_keywords(patcher, change.fsdp)
    if change.sync_every is not None:
        sync_every(patcher, change.sync_every)
    if change.autocast_off is not None:
        _autocast_off(patcher, change.autocast_off)
    if change.ddp or change.autocast is not None:
        from torch.nn.parallel import DistributedDataParallel

        if change.ddp:
            patcher.replace(DistributedDataParallel, "__init__", lambda init: _with_keywords(init, change.ddp))
        if change.autocast is not None:
            dtype = change.autocast
            patcher.replace(DistributedDataParallel, "__call__", lambda call: _under_autocast(call, dtype))
    return patcher


def _force_threads(patcher: Patcher, threads: int) -> None:
    import torch

    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    # The script's own call would undo the change being timed: it keeps the trial's count.
    patcher.replace(torch, "set_num_threads", lambda _original: lambda _n: None)


def _force_fsdp_keywords(patcher: Patcher, forced: dict[str, Any]) -> None:
    """Every ``fully_shard`` call takes ``forced``, whichever module the script imports it from."""
    import importlib

    def counted(shard: Callable[..., Any]) -> Callable[..., Any]:
        with_keywords = _with_keywords(shard, forced)

        @functools.wraps(shard)
        def fully_shard(*args: Any, **kwargs: Any) -> Any:
            APPLIED["fully_shard calls with " + ", ".join(f"{k}={v!r}" for k, v in forced.items())] += 1
            return with_keywords(*args, **kwargs)

        return fully_shard

    if forced.get("reshard_after_forward") is False:
        _shard_grad_op(patcher)
    wrapped: dict[int, Callable[..., Any]] = {}  # one wrapper per function, whatever names it goes by
    for name in ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard", "torch.distributed._composable.fsdp"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        shard = getattr(module, "fully_shard", None)
        if shard is not None:
            new = wrapped.setdefault(id(shard), counted(shard))
            patcher.put(module, "fully_shard", new)


def _shard_grad_op(patcher: Patcher) -> None:
    """The older ``FullyShardedDataParallel``'s reshard_after_forward=False: its ZeRO-2 strategies, where the
    script left the default full sharding (an explicit other strategy stays)."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    instead = {
        None: ShardingStrategy.SHARD_GRAD_OP,
        ShardingStrategy.FULL_SHARD: ShardingStrategy.SHARD_GRAD_OP,
        ShardingStrategy.HYBRID_SHARD: ShardingStrategy._HYBRID_SHARD_ZERO2,
    }

    def zero2(arguments: dict[str, Any]) -> dict[str, Any]:
        strategy = arguments.get("sharding_strategy")
        if strategy not in instead:
            return {}
        APPLIED[f"FullyShardedDataParallel with sharding_strategy={instead[strategy].name}"] += 1
        return {"sharding_strategy": instead[strategy]}

    patcher.replace(FullyShardedDataParallel, "__init__", lambda init: _with_keywords(init, zero2))


def _with_keywords(
    init: Callable[..., Any],
    forced: dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]],
    applies: Callable[[dict[str, Any]], bool] | None = None,
) -> Callable[..., Any]:
    """``init`` (a constructor's ``__init__`` or a function such as ``fully_shard``) with ``forced`` keyword
    arguments (or those ``forced`` makes of the call's arguments), wherever the call's arguments satisfy
    ``applies``; it returns what ``init`` returns."""
    signature = inspect.signature(init)

    # The original's signature shows through (Lightning rebuilds a DataLoader from the parameters it names).
    @functools.wraps(init)
    def __init__(obj: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(obj, *args, **kwargs)  # a keyword the script passed by position still counts
        if applies is None or applies(bound.arguments):
            bound.arguments.update(forced(bound.arguments) if callable(forced) else forced)
        return init(*bound.args, **bound.kwargs)

    return __init__


def _map_style(arguments: dict[str, Any]) -> bool:
    """Workers each iterate an IterableDataset whole, unless it shards itself: only a map-style one gets them."""
    from torch.utils.data import IterableDataset

    return not isinstance(arguments.get("dataset"), IterableDataset)


# What this rank applied while it ran, for its result (job/rank_main.py): a fix that never ran shows.
APPLIED: Counter[str] = Counter()


def _thin_saves(patcher: Patcher, every: int, at: str | None) -> None:
    """torch.save writes on the last call of every ``every`` (from the line ``at``), as ``if (step + 1) % every ==
    0:`` around it would; the others return without serializing."""
    import torch

    from ..sites import user_site

    def thinned(save: Callable[..., Any]) -> Callable[..., Any]:
        calls: Counter[str] = Counter()

        @functools.wraps(save)
        def save_(*args: Any, **kwargs: Any) -> Any:
            site = user_site(sys._getframe(1))
            where = f"{site.file}:{site.line}" if site is not None else "?"
            if at is not None and where != at:
                return save(*args, **kwargs)
            calls[where] += 1
            if calls[where] % every:
                APPLIED["torch.save calls skipped"] += 1
                return None
            APPLIED["torch.save calls written"] += 1
            return save(*args, **kwargs)

        return save_

    patcher.replace(torch, "save", thinned)


def _autocast_off(patcher: Patcher, dtype: str) -> None:
    """Every ``torch.autocast`` (``torch.amp.autocast``, the device-specific ones built on it) in ``dtype`` is built
    disabled, as ``enabled=False`` on the script's calls would; those in another dtype stay as they are."""
    import torch
    from torch.amp.autocast_mode import autocast

    off = getattr(torch, dtype)

    def disabled(arguments: dict[str, Any]) -> dict[str, Any]:
        # No dtype given: the device's default autocast dtype (bfloat16 on the CPU, float16 on CUDA).
        chosen = arguments.get("dtype") or torch.get_autocast_dtype(arguments["device_type"])
        if chosen != off or not arguments.get("enabled", True):
            return {}
        APPLIED[f"autocasts in {dtype} turned off"] += 1
        return {"enabled": False}

    patcher.replace(autocast, "__init__", lambda init: _with_keywords(init, disabled))


def _under_autocast(call: Callable[..., Any], dtype: str) -> Callable[..., Any]:
    def __call__(model: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        if model.training and torch.is_grad_enabled():
            APPLIED[f"forwards under autocast {dtype}"] += 1
        with torch.autocast(getattr(model, "device_type", "cpu"), dtype=getattr(torch, dtype)):
            return call(model, *args, **kwargs)

    return __call__


def observed(recordings: list[Recording], applied: list[dict[str, int]] | None = None) -> dict[str, Any]:
    """What a timed run's ranks really trained with: threads, DDP's settings and buckets, all-reduces per step, and
    (from each rank's ``APPLIED``) what a wrapper changed."""
    out: dict[str, Any] = {"ranks": len(recordings)}
    for counts in applied or ():
        for key, n in counts.items():
            out[key] = out.get(key, 0) + n
    threads = sorted({r.threads_seen for r in recordings if r.threads_seen is not None})
    if threads:
        out["threads"] = threads
    unused = sorted(
        {bool(r.reducer["find_unused_parameters"]) for r in recordings if "find_unused_parameters" in r.reducer}
    )
    if unused:
        out["find_unused_parameters"] = unused
    workers = sorted({int(loader.settings.get("num_workers", 0)) for r in recordings for loader in r.loaders})
    if workers:
        out["num_workers"] = workers
    for key, kind in (("gradient_as_bucket_view", bool), ("static_graph", bool), ("buckets", int)):
        values = sorted({kind(r.reducer[key]) for r in recordings if key in r.reducer})
        if values:
            out[key] = values
    gathers = [c.buckets for r in recordings for c in r.communication if c.kind == "fsdp"]
    if gathers:
        out["fsdp_collectives_per_step"] = round(sum(gathers) / len(gathers), 2)
    passes = [c.passes for r in recordings for c in r.communication]
    if passes:
        out["synced_passes_per_step"] = round(sum(passes) / len(passes), 2)
    return out
