"""Epoch iteration that can restart at any batch with the exact same order and random state.

A plain DataLoader draws from the global RNG at two moments of an epoch: a base seed for
its workers when a (non-persistent) iterator is created, and the sampler's shuffle seed at
the first pull of indices. A resumed run must see the same draws in the same order, then
skip the batches already trained on *without loading them*, then continue with the random
state saved at the checkpoint. This module does exactly that:

* the Trainer's internal loader gets a :class:`ResumableBatches` batch sampler that wraps
  the user's, so skipping works on index lists, not on data;
* :class:`EpochSource` records the RNG state at the start of each epoch (``epoch_rng``) and,
  on resume, replays it before the sampler draws and restores the checkpoint's state
  (``rng``) before the first batch is fetched.

Random transforms inside DataLoader *workers* are seeded per worker by PyTorch; after a
mid-epoch resume a worker sees different batches than before, so such transforms are only
reproduced when they derive their randomness from the sample index.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import signal
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from torch.utils.data import DataLoader, Sampler

from ..config import ConfigError
from ..data import pipeline
from . import rng

__all__ = ["ResumableBatches", "EpochSource", "Position", "WorkerDied"]

log = logging.getLogger("turbotrain")


@dataclass
class Position:
    """Where a run stands: the next batch to train on is batch ``batches_done`` of ``epoch``."""

    epoch: int
    batches_done: int
    rng: dict  # the random state to continue with
    epoch_rng: dict | None  # the state the epoch started with (needed when batches_done > 0)
    iterator_reused: bool  # the epoch's DataLoader iterator was a persistent one, reused
    batch_size: int | None = None  # the loader's when saved: a resume with another one continues at the same sample


def _skip(it: Iterator[Any], skip: int) -> None:
    """Draw ``skip`` items of ``it``; a clear error (not "generator raised StopIteration") when it has fewer."""
    for done in range(skip):
        if next(it, None) is None:
            raise ConfigError(
                f"resuming at batch {skip} of the epoch, but the batch sampler has only {done}: the data or the "
                "batch size changed since the checkpoint; resume with the loader that wrote it."
            )


class ResumableBatches(Sampler):
    """The user's batch sampler, able to start an epoch at batch ``skip``."""

    def __init__(self, inner: Iterable[list[int]]):
        self.inner = inner
        self._skip = 0
        self._after_skip: Callable[[], None] | None = None
        self._primed: Iterator[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]  # a sized sampler has one; len() raises as it would

    def plan_start(self, skip: int, after_skip: Callable[[], None] | None) -> None:
        """The next epoch starts at batch ``skip``; ``after_skip`` runs once indices are drawn."""
        self._skip, self._after_skip = skip, after_skip

    def prime(self, skip: int) -> None:
        """Draw the epoch's indices now (the sampler's RNG draws happen here) and skip ``skip``."""
        it = iter(self.inner)
        _skip(it, skip)
        head = next(it, None)
        self._primed = iter(()) if head is None else itertools.chain([head], it)
        self._skip, self._after_skip = 0, None

    def __iter__(self) -> Iterator[list[int]]:
        # A generator: nothing below runs until the DataLoader pulls the first index list,
        # which is exactly when a plain DataLoader's sampler would draw its shuffle seed.
        if self._primed is not None:
            it, self._primed = self._primed, None
        else:
            it = iter(self.inner)
            skip, after, self._skip, self._after_skip = self._skip, self._after_skip, 0, None
            _skip(it, skip)
            if after is not None:
                after()
        yield from it


def _worker_ignoring_sigterm(user_init: Callable[[int], None] | None, worker_id: int) -> None:
    """DataLoader workers leave SIGTERM to the main process, which checkpoints and then stops them.

    Slurm (scancel, preemption) signals every process of a job step, DataLoader workers
    included. PyTorch's workers die on SIGTERM, and the main process then fails with "worker
    killed by signal: Terminated" instead of saving at the next step boundary.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if user_init is not None:
        user_init(worker_id)


class WorkerDied(RuntimeError):
    """A DataLoader worker process died (killed, or exited) while training read from it."""


def worker_death(exc: BaseException, iterator: Any, where: str) -> WorkerDied | None:
    """A clearer error where a DataLoader worker of ``iterator`` died: the error that surfaced was its doing; None
    when every worker is alive.

    PyTorch names the pid only ("DataLoader worker (pid(s) N) exited unexpectedly"), and without a cause when the
    death is noticed while waiting for data. Its SIGCHLD handler raises wherever the main process is: inside
    ``torch.save`` the checkpoint writer then fails with an error of its own ("unexpected pos") and PyTorch's is
    lost. The iterator's worker processes tell which worker it was and how it ended.
    """
    dead = [(i, w) for i, w in enumerate(getattr(iterator, "_workers", ())) if w.exitcode not in (None, 0)]
    if not dead:
        return None
    told = []
    for i, w in dead:
        how = (
            f"was killed by signal {signal.Signals(-w.exitcode).name}"
            if w.exitcode < 0
            else f"exited with code {w.exitcode}"
        )
        told.append(f"DataLoader worker {i} (pid {w.pid}) {how}")
    hint = (
        " SIGKILL usually comes from the kernel's out-of-memory killer (dmesg tells): lower num_workers, "
        "prefetch_factor or the memory each worker holds."
        if any(w.exitcode == -signal.SIGKILL for _, w in dead)
        else ""
    )
    surfaced = (
        ""
        if str(exc).startswith("DataLoader worker (pid")
        else f" It surfaced where the loop was as {type(exc).__name__}: {str(exc).strip()[:200]}."
    )
    return WorkerDied(
        f"{'; '.join(told)} {where}.{surfaced}{hint} Training stopped; fit(resume=True) continues from the last "
        "checkpoint."
    )


class EpochSource:
    """Hands the Trainer each epoch's batches, from the start or from a saved Position."""

    def __init__(self, loader: Any, rebuild: Callable[..., Any]):
        """``rebuild(loader, **extra)`` applies the plan's loader switches (``Runtime.rebuild_loader``)."""
        self.user_loader = loader
        # The pipeline (data/pipeline.py) composes plan settings -> these batches -> read-ahead; the loader
        # arrives sharded by the launch's coordinator (Trainer.fit), the sampler stage.
        planned, self.batches = pipeline.training_loader(
            loader, rebuild, resumable=ResumableBatches, worker_init=_worker_ignoring_sigterm
        )
        self.loader = planned
        self.generators = rng.generators_of(planned) if isinstance(planned, DataLoader) else []
        self._persistent = isinstance(planned, DataLoader) and planned.persistent_workers
        self._iterated = False
        self.epoch_rng: dict | None = None
        self.epoch_reused = False
        self.iterator: Iterator[Any] | None = None  # this epoch's, to tell which worker died

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def has_length(self) -> bool:
        try:
            len(self.loader)
        except TypeError:
            return False
        return True

    def _batching(self) -> tuple[int | None, bool | None, int | None]:
        """Batch size, drop_last and samples an epoch (this process's), where the loader says."""
        owner = self.batches.inner if self.batches is not None else self.loader
        size, drop = getattr(owner, "batch_size", None), getattr(owner, "drop_last", None)
        try:
            samples: int | None = len(getattr(owner, "sampler", None))  # type: ignore[arg-type]  # TypeError if unsized
        except (TypeError, NotImplementedError):
            samples = None
        return size if isinstance(size, int) else None, drop if isinstance(drop, bool) else None, samples

    @property
    def batch_size(self) -> int | None:
        return self._batching()[0]

    def describe(self) -> str:
        """The training loader in words, for errors: its type, samples an epoch, batch size, drop_last."""
        size, drop, samples = self._batching()
        parts = [
            f"{samples} samples an epoch" if samples is not None else "",
            f"batch_size={size}" if size is not None else "",
            f"drop_last={drop}" if drop is not None else "",
        ]
        return f"{type(self.user_loader).__name__}({', '.join(p for p in parts if p)})"

    def no_batches(self, epoch: int) -> ConfigError:
        """The error for an epoch that yielded no batch: no step limit would ever be reached."""
        size, drop, samples = self._batching()
        if drop and size is not None and 0 < (samples or 0) < size:
            fix = (
                f"drop_last drops every batch, since {samples} samples do not fill one of {size}: lower the "
                f"batch size to {samples} or less, or set drop_last=False."
            )
        elif samples == 0:
            fix = "Its data set is empty: check the data's path and any filter."
        elif epoch > 0:
            fix = (
                "A generator or iterator is used up after one pass: give a loader that can be iterated again "
                "(a DataLoader or a list), or limit training with max_epochs."
            )
        else:
            fix = "Check that it yields batches (is its data set empty?)."
        return ConfigError(f"the training loader {self.describe()} yielded no batch in epoch {epoch}. {fix}")

    def resume_position(self, pos: Position, accum_steps: int) -> Position:
        """``pos`` for this loader: at the same sample when its batch size changed since the checkpoint.

        ValueError, saying why, when this loader cannot continue from ``pos``.
        """
        size, drop, samples = self._batching()
        length = len(self) if self.has_length else None
        done, old = pos.batches_done, pos.batch_size
        if done and old and size and old != size:
            seen = done * old
            finished = samples is not None and done >= (samples // old if drop else -(-samples // old))
            if finished:
                done = length if length is not None else -(-seen // size)
            elif seen % size or (seen // size) % accum_steps:
                raise ValueError(
                    f"it was saved {done} batches of {old} ({seen} samples) into epoch {pos.epoch}, which is not a "
                    f"whole number of optimizer steps with batches of {size}; finish this epoch with "
                    f"batch_size={old}, or use a batch size that divides {seen}"
                )
            else:
                done = seen // size
            log.warning(
                "turbotrain: the batch size changed from %d to %d since the checkpoint; resuming epoch %d after "
                "the same %d samples (batch %d)",
                old,
                size,
                pos.epoch,
                seen,
                done,
            )
        if length is not None and done > length:
            raise ValueError(
                f"it was saved at batch {done} of epoch {pos.epoch}, and this run's loader {self.describe()} has "
                f"{length} batches an epoch: the data or the batch size changed"
            )
        return dataclasses.replace(pos, batches_done=done, batch_size=size)

    def _set_epoch(self, epoch: int) -> None:
        for owner in (
            getattr(self.loader, "sampler", None),
            self.batches and self.batches.inner,
            getattr(self.batches and self.batches.inner, "sampler", None),
            getattr(self.loader, "dataset", None),
        ):
            set_epoch = getattr(owner, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    def close(self) -> None:
        """Stop DataLoader workers now rather than whenever the loader or iterator is collected."""
        iterators = {id(it): it for it in (getattr(self.loader, "_iterator", None), self.iterator) if it is not None}
        for iterator in iterators.values():
            if hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
            for worker in getattr(iterator, "_workers", ()):
                if worker.is_alive():  # hung: PyTorch's terminate() is a SIGTERM, which the workers ignore
                    worker.kill()
                    worker.join(timeout=5)
        if iterators and isinstance(self.loader, DataLoader):
            self.loader._iterator = None
        self.iterator = None
        self._iterated = False

    def next_epoch_reuses_iterator(self) -> bool:
        return self._persistent and self._iterated

    def epoch(self, epoch: int, position: Position | None = None) -> Iterator[Any]:
        """An iterator over this epoch's batches (from ``position`` when resuming)."""
        self._set_epoch(epoch)
        if position is None:
            self.epoch_reused = self.next_epoch_reuses_iterator()
            self.epoch_rng = rng.capture(self.generators)
            it = iter(self.loader)
        else:
            it = self._resume(position)
        self._iterated = True
        self.iterator = it
        return it

    def worker_death(self, exc: BaseException, where: str) -> WorkerDied | None:
        return worker_death(exc, self.iterator, where)

    def _resume(self, pos: Position) -> Iterator[Any]:
        skip = pos.batches_done
        start_state = pos.epoch_rng if skip else pos.rng
        rng.restore(start_state, self.generators)  # type: ignore[arg-type]  # epoch_rng is set when skip > 0
        self.epoch_rng = start_state
        self.epoch_reused = pos.iterator_reused
        if self.batches is None:
            it = iter(self.loader)
            if skip:
                log.warning(
                    "turbotrain: resuming mid-epoch on a loader without a batch sampler: "
                    "reading and discarding %d batch(es) to reach the saved position",
                    skip,
                )
                it = itertools.islice(it, skip, None)
                rng.restore(pos.rng, self.generators)
            return it
        if pos.iterator_reused:
            # The original run reused a persistent iterator, which draws no new worker seed:
            # draw the sampler's indices first, then create the (new) iterator, then put the
            # random state back to what it was after the sampler's draws.
            self.batches.prime(skip)
            after_draws = rng.capture(self.generators)
            it = iter(self.loader)
            rng.restore(pos.rng if skip else after_draws, self.generators)
            return it
        after = (lambda: rng.restore(pos.rng, self.generators)) if skip else None
        self.batches.plan_start(skip, after)
        return iter(self.loader)
