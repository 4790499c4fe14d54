"""Timing a Plan on a user's own model and batches: the one measurement doctor, tune and bench share.

``run_trial`` trains a *copy* of the model (the original, its optimizer and every RNG are
left exactly as they were) for a few steps on a fixed list of batches, and reports
steady-state time per step, the first steps' (compile) time separately, peak memory and
the loss of every step, so a caller can compare plans for speed and for numerics.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from .plan import Plan
from .runtime import prepare
from .data.transfer import batch_size_of
from .train import rng

__all__ = ["Trial", "run_trial", "time_loader", "preserved_state", "peak_host_memory"]

log = logging.getLogger("turbotrain")


@dataclass
class Trial:
    plan: Plan
    samples_per_step: int
    step_times_s: list[float] = field(default_factory=list)   # steady-state steps only
    warmup_s: float = 0.0                                       # the warm-up steps (compile, autotune)
    losses: list[float] = field(default_factory=list)           # every step, warm-up included
    peak_memory_bytes: int | None = None
    applied: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.step_times_s)

    @property
    def step_s(self) -> float:
        """Median steady-state seconds per optimizer step."""
        return statistics.median(self.step_times_s) if self.step_times_s else float("inf")

    @property
    def spread(self) -> float:
        """Relative spread of step times: (p90 - p10) / median."""
        if len(self.step_times_s) < 3:
            return 0.0
        q = statistics.quantiles(self.step_times_s, n=10)
        return (q[-1] - q[0]) / self.step_s

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_step / self.step_s if self.ok else 0.0

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else float("nan")


def peak_host_memory() -> int | None:
    """This process's peak resident memory (VmHWM) in bytes, or None where unavailable."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_host_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # Linux: reset VmHWM to the current resident size
    except OSError:
        pass


@contextlib.contextmanager
def preserved_state(*modules_and_optimizers: Any) -> Iterator[None]:
    """Restore RNGs, backend flags and the given models'/optimizers' state dicts on exit."""
    saved_rng = rng.capture()
    flags = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    saved = [(obj, copy.deepcopy(obj.state_dict())) for obj in modules_and_optimizers]
    try:
        yield
    finally:
        for obj, state in saved:
            obj.load_state_dict(state)
        torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
        rng.restore(saved_rng)


def run_trial(model: nn.Module, optimizer_fn: Callable, loss_fn: Callable | None, batches: Sequence[Any],
              plan: Plan, steps: int = 10, warmup: int = 3, step_fn: Callable | None = None,
              seed: int = 0, loader: Iterable | None = None) -> Trial:
    """Train a deep copy of ``model`` for ``warmup + steps`` optimizer steps under ``plan``.

    ``batches`` are reused cyclically (``(inputs, targets)`` for ``loss_fn``, anything for
    ``step_fn(model, batch) -> loss``). Errors (out of memory, a compile failure) are caught
    and reported in ``Trial.error``; the caller's model, optimizer and RNGs are untouched.

    With ``loader`` (``batches`` is then ignored) every micro-batch comes from the loader rebuilt
    with the plan's loader switches and moved as the plan says (pinning, non_blocking, prefetch),
    so the data path is timed too; the loader starts over when it runs out.
    """
    if not batches and loader is None:
        raise ValueError("run_trial needs at least one batch (or a loader)")
    per_step = batch_size_of(batches[0]) * plan.grad_accum_steps if loader is None else 0  # loader: set below
    trial = Trial(plan=plan, samples_per_step=per_step)
    with preserved_state():
        torch.manual_seed(seed)
        try:
            work = copy.deepcopy(model)
            optimizer = optimizer_fn(work.parameters())
            rt = prepare(work, optimizer, plan, on_skip=lambda name, why: trial.skipped.append((name, why)))
            trial.applied = list(rt.applied)
            cuda = rt.device.type == "cuda"
            if loader is not None:
                stream = _endless(lambda: rt.device_batches(rt.rebuild_loader(loader)))
                first = next(stream)
                trial.samples_per_step = batch_size_of(first) * rt.accum_steps
                stream = itertools.chain([first], stream)
            else:
                device_batches = [rt.to_device(b) for b in batches]
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(rt.device)
            else:
                _reset_host_peak()
            warm_start = time.perf_counter()
            for i in range(warmup + steps):
                started = time.perf_counter()
                loss_sum = 0.0
                for j in range(rt.accum_steps):
                    batch = (next(stream) if loader is not None
                             else device_batches[(i * rt.accum_steps + j) % len(device_batches)])
                    with rt.autocast():
                        loss = step_fn(rt.model, batch) if step_fn else loss_fn(rt.model(batch[0]), batch[1])
                    with rt.no_sync(j + 1 < rt.accum_steps):
                        rt.backward(loss / rt.accum_steps if rt.accum_steps > 1 else loss)
                    loss_sum += float(loss.detach())  # trials measure, a sync per step is intended
                for opt in rt.optimizers:
                    rt.optimizer_step(opt)
                rt.end_step()
                if cuda:
                    torch.cuda.synchronize()
                trial.losses.append(loss_sum / rt.accum_steps)
                if i == warmup - 1:
                    trial.warmup_s = time.perf_counter() - warm_start
                elif i >= warmup:
                    trial.step_times_s.append(time.perf_counter() - started)
            trial.peak_memory_bytes = (torch.cuda.max_memory_allocated(rt.device) if cuda else peak_host_memory())
        except Exception as exc:  # noqa: BLE001 - a failing candidate is a result, not a crash
            trial.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # give back what the failed candidate held before the next one
        finally:
            work = optimizer = rt = device_batches = stream = None  # noqa: F841 - free before returning
    return trial


def _endless(make_epoch: Callable[[], Iterable]) -> Iterator[Any]:
    """Batches from ``make_epoch()``, started again each time an epoch runs out."""
    while True:
        empty = True
        for batch in make_epoch():
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader yields no batches (fewer samples than one batch with drop_last?)")


def time_loader(loader: Any, batches: int = 20, warmup: int = 2, **overrides: Any) -> float:
    """Batches per second a DataLoader delivers (with ``overrides`` such as ``num_workers=2``).

    Worker start-up is part of ``warmup``; only the loader is timed, no model runs.
    """
    from .data.loader import rebuild_loader

    loader = rebuild_loader(loader, **overrides) if overrides else loader
    it = iter(loader)
    try:
        for _ in range(warmup):
            next(it)
        started = time.perf_counter()
        done = 0
        for _ in range(batches):
            try:
                next(it)
            except StopIteration:
                break
            done += 1
        elapsed = time.perf_counter() - started
    finally:
        del it  # shut worker processes down now, not at garbage collection
    return done / elapsed if elapsed > 0 and done else 0.0
