"""The wrappers a recording installs around torch calls (all undone by the recorder's Patcher).

Every wrapper starts with the same cheap test (a recording is active, on the script's own
thread, not inside torch.compile's tracing) and otherwise calls the original unchanged.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from . import active
from .patching import Patcher
from .records import LoaderRecord
from .sites import USER_FILES, caller_site, user_site

__all__ = ["install", "measured_call", "wrap_sync", "SYNC_METHODS"]

if TYPE_CHECKING:
    from .recorder import Recorder

SYNC_METHODS = ("item", "tolist", "numpy", "cpu", "nonzero", "__bool__", "__float__", "__int__", "__repr__",
                "__format__")

_get_ident = threading.get_ident
_perf = active.perf_counter
_compiling = active.compiling


def _live() -> "Recorder | None":
    """The active recorder when this call should be recorded, else None."""
    rec = active.current
    if rec is None or rec.busy or _get_ident() != rec.thread or _compiling():
        return None
    return rec


# -- phases -----------------------------------------------------------------------------------------

def _phase(phase: str, original: Callable, on_enter: Callable | None = None, untimed_ok: bool = False,
           on_exit: Callable | None = None) -> Callable:
    """Time ``original`` as ``phase``. With ``untimed_ok`` (the backward: its time is compute either way,
    as untimed time after the forward) only the bookkeeping runs, unless a trace range or device time
    is wanted. ``on_exit(rec)`` runs after a call that returned."""

    def wrapper(*args, **kwargs):
        rec = _live()
        if rec is None:
            return original(*args, **kwargs)
        if on_enter is not None:
            on_enter(rec)
        if untimed_ok and not rec.profiling and not rec.gpu and rec.open_step.marks and not rec.stack:
            out = original(*args, **kwargs)
        else:
            rec.push(phase)
            if rec.gpu:
                rec.gpu_mark(phase, start=True)
            try:
                out = original(*args, **kwargs)
            finally:
                if rec.gpu:
                    rec.gpu_mark(phase, start=False)
                rec.pop()
        if on_exit is not None:
            on_exit(rec)
        return out

    wrapper.__name__ = getattr(original, "__name__", phase)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__wrapped__ = original
    return wrapper


def _copy(original: Callable) -> Callable:
    """``Tensor.to`` / ``Tensor.cuda``: host-to-device copies (a device-to-host one is a sync)."""

    def method(self, *args, **kwargs):
        rec = _live()
        if rec is None:
            return original(self, *args, **kwargs)
        src = self.device
        rec.push("h2d")
        out = None
        try:
            out = original(self, *args, **kwargs)
        finally:
            moved = isinstance(out, torch.Tensor) and out.device != src
            to_host = moved and out.device.type == "cpu"
            seconds = rec.pop(("sync" if to_host else "h2d") if moved else None)
        if moved:
            frame = sys._getframe(1)
            site = user_site(frame)
            if to_host:
                tally = rec.tally("sync:to_cpu", site)
            else:
                tally = rec.tally("h2d", site)
                if tally is not None and not tally.detail:
                    tally.detail["non_blocking"] = bool(kwargs.get("non_blocking")) or any(
                        a is True for a in args)
                    tally.detail["pinned"] = bool(src.type == "cpu" and rec.gpu and self.is_pinned())
            if tally is not None:
                tally.add(rec.step_index, seconds, self.numel() * self.element_size())
        return out

    method.__name__ = original.__name__
    method.__doc__ = original.__doc__
    return method


def _zero_grad(original: Callable) -> Callable:
    def zero_grad(self, *args, **kwargs):
        rec = _live()
        if rec is None:
            return original(self, *args, **kwargs)
        set_to_none = kwargs.get("set_to_none", args[0] if args else True)
        opened = rec.open_step
        rec.zero_grads["before_backward" if opened.forwards and not opened.backwards else "elsewhere"] += 1
        rec.push("optimizer")
        try:
            return original(self, *args, **kwargs)
        finally:
            rec.pop()
            if not set_to_none:
                tally = rec.tally("zero_grad_zeros", user_site(sys._getframe(1)))
                if tally is not None:
                    tally.add(rec.step_index)

    zero_grad.__doc__ = original.__doc__
    return zero_grad


def _timed_site(kind: str, phase: str | None, original: Callable) -> Callable:
    """Calls counted (and timed) per site: torch.save, empty_cache, torch.compile, ..."""

    def wrapper(*args, **kwargs):
        rec = _live()
        if rec is None:
            return original(*args, **kwargs)
        site = user_site(sys._getframe(1))
        if phase:
            rec.push(phase)
        started = _perf()
        try:
            return original(*args, **kwargs)
        finally:
            seconds = rec.pop() if phase else _perf() - started
            tally = rec.tally(kind, site)
            if tally is not None:
                tally.add(rec.step_index, seconds)

    wrapper.__name__ = getattr(original, "__name__", kind)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__wrapped__ = original
    return wrapper


# -- data ----------------------------------------------------------------------------------------------

def _in_phase(rec: "Recorder", phase: str, fn: Callable, *args: Any) -> tuple[Any, float]:
    """``fn(*args)`` timed as ``phase``: its result and its own seconds."""
    rec.push(phase)
    try:
        out = fn(*args)
    except BaseException:
        rec.pop()
        raise
    return out, rec.pop()


def _loader_settings(loader: DataLoader) -> dict[str, Any]:
    dataset = loader.dataset
    try:
        length = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        length = None
    try:
        batches = len(loader)
    except TypeError:
        batches = None
    return {"num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
            "persistent_workers": loader.persistent_workers, "batch_size": loader.batch_size,
            "prefetch_factor": loader.prefetch_factor, "dataset": type(dataset).__name__,
            "dataset_len": length, "batches_per_epoch": batches, "drop_last": loader.drop_last}


def _loader_record(rec: "Recorder", loader: DataLoader, site=None) -> LoaderRecord:
    record = rec.loaders.get(id(loader))
    if record is None or record.loader is not loader:
        record = rec.loaders[id(loader)] = LoaderRecord(loader, site, _loader_settings(loader))
    return record


def _loader_init(original: Callable) -> Callable:
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        rec = _live()
        if rec is not None:
            _loader_record(rec, self, user_site(sys._getframe(1)))

    __init__.__doc__ = original.__doc__
    return __init__


def _loader_iter(original: Callable) -> Callable:
    def __iter__(self):
        rec = _live()
        if rec is None:
            return original(self)
        rec.step_starts()
        it, seconds = _in_phase(rec, "data", original, self)
        _loader_record(rec, self)
        try:
            it._tt_loader = id(self)
            it._tt_start = seconds  # worker start-up; the first batch's wait is added on next()
        except AttributeError:
            pass
        return it

    return __iter__


def _iter_next(original: Callable) -> Callable:
    def __next__(self):
        rec = _live()
        if rec is None:
            return original(self)
        rec.step_starts()
        batch, seconds = _in_phase(rec, "data", original, self)
        record = rec.loaders.get(getattr(self, "_tt_loader", -1))
        if record is not None:
            record.nexts.add(rec.step_index, seconds)
            start = self.__dict__.pop("_tt_start", None)
            if start is not None:
                record.starts.append((rec.step_index, start + seconds))
        return batch

    return __next__


def _tensor_factory(original: Callable) -> Callable:
    """``torch.tensor(ndarray)`` copies; ``torch.from_numpy`` would not."""

    def tensor(data, *args, **kwargs):
        rec = _live()
        if rec is None:
            return original(data, *args, **kwargs)
        if type(data).__module__ != "numpy" or not hasattr(data, "nbytes"):
            # What the user's line really passes (a list, a scalar): the NumPy rule stays quiet there.
            tally = rec.tally("tensor_other", caller_site(sys._getframe(1)))
            if tally is not None:
                tally.add(rec.step_index)
            return original(data, *args, **kwargs)
        site = caller_site(sys._getframe(1))
        started = _perf()
        out = original(data, *args, **kwargs)
        tally = rec.tally("tensor_copy", site)
        if tally is not None:
            tally.add(rec.step_index, _perf() - started, int(data.nbytes))
        return out

    tensor.__doc__ = original.__doc__
    tensor.__wrapped__ = original
    return tensor


# -- model structure -------------------------------------------------------------------------------------

def _softmax(original: Callable) -> Callable:
    def softmax(*args, **kwargs):
        rec = _live()
        if rec is None:
            return original(*args, **kwargs)
        rec.busy = True  # F.softmax calls Tensor.softmax: count the user's call once
        try:
            return original(*args, **kwargs)
        finally:
            rec.busy = False
            tally = rec.tally("softmax", user_site(sys._getframe(1)))
            if tally is not None:
                tally.add(rec.step_index)
                if "shape" not in tally.detail and args and isinstance(args[0], torch.Tensor):
                    tally.detail["shape"] = tuple(args[0].shape)

    softmax.__doc__ = getattr(original, "__doc__", None)
    return softmax


def _matmul(original: Callable) -> Callable:
    """Operand shapes per user line, during warm-up only (sizes a measured attention what-if)."""

    def matmul(a, b, *args, **kwargs):
        rec = _live()
        if rec is not None and rec.modules.discovery and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            site = caller_site(sys._getframe(1))
            if site is not None:
                rec.matmul_shapes.setdefault(site, (tuple(a.shape), tuple(b.shape)))
        return original(a, b, *args, **kwargs)

    matmul.__doc__ = getattr(original, "__doc__", None)
    return matmul


def _module_init(original: Callable) -> Callable:
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        rec = active.current
        # Keyed by id, never by the module: a subclass may define __hash__ on attributes its own
        # __init__ has not set yet (torchmetrics does), and this runs inside that __init__.
        if rec is not None and _get_ident() == rec.thread and id(self) not in rec.module_sites:
            site = user_site(sys._getframe(1))
            if site is not None:
                rec.module_sites[id(self)] = (weakref.ref(self), site)

    __init__.__doc__ = original.__doc__
    return __init__


def _optimizer_init(original: Callable) -> Callable:
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        rec = active.current
        if rec is not None and _get_ident() == rec.thread:
            rec.note_optimizer(self, user_site(sys._getframe(1)))

    __init__.__doc__ = original.__doc__
    return __init__


def _on_backward(rec: "Recorder") -> None:
    rec.modules.on_backward()


def _after_backward(rec: "Recorder") -> None:
    rec.after_backward()


def install(rec: "Recorder", patcher: Patcher) -> None:
    """Install every wrapper on ``patcher`` (restored when the recording ends)."""
    for name in SYNC_METHODS:
        patcher.replace(torch.Tensor, name, lambda orig, kind=name.strip("_"): wrap_sync(kind, orig))
    patcher.replace(torch.Tensor, "to", _copy)
    patcher.replace(torch.Tensor, "cuda", _copy)
    patcher.replace(torch.autograd, "backward", lambda orig: _phase("backward", orig, _on_backward, untimed_ok=True,
                                                                    on_exit=_after_backward))
    patcher.replace(torch.autograd, "grad", lambda orig: _phase("backward", orig))
    patcher.replace(torch.optim.Optimizer, "zero_grad", _zero_grad)
    patcher.replace(nn.Module, "zero_grad", _zero_grad)
    patcher.replace(torch, "save", lambda orig: _timed_site("save", "save", orig))
    patcher.replace(torch.cuda, "empty_cache", lambda orig: _timed_site("empty_cache", None, orig))
    patcher.replace(torch, "compile", lambda orig: _timed_site("compile", None, orig))
    patcher.replace(torch.jit, "script", lambda orig: _timed_site("jit", None, orig))
    patcher.replace(torch.jit, "trace", lambda orig: _timed_site("jit", None, orig))
    patcher.replace(torch, "tensor", _tensor_factory)
    patcher.replace(torch, "softmax", _softmax)
    patcher.replace(F, "softmax", _softmax)
    patcher.replace(torch.Tensor, "softmax", _softmax)
    patcher.replace(torch, "matmul", _matmul)
    patcher.replace(torch.Tensor, "__matmul__", _matmul)
    patcher.replace(DataLoader, "__init__", _loader_init)
    patcher.replace(DataLoader, "__iter__", _loader_iter)
    patcher.replace(_BaseDataLoaderIter, "__next__", _iter_next)
    patcher.replace(nn.Module, "__init__", _module_init)
    patcher.replace(torch.optim.Optimizer, "__init__", _optimizer_init)
    from torch.nn.parallel import DistributedDataParallel

    patcher.replace(DistributedDataParallel, "no_sync", lambda orig: _timed_site("no_sync", None, orig))


# -- outermost modules and host syncs -------------------------------------------------------------

def measured_call(original: Callable) -> Callable:
    """``__call__`` for the class of an outermost module: see :mod:`turbotrain.doctor.discovery`."""

    def __call__(self, *args, **kwargs):
        rec = active.current
        if rec is None or id(self) not in rec.modules.top_ids or _get_ident() != rec.thread:
            return original(self, *args, **kwargs)
        phase = rec.modules.call_enter(self, args, kwargs)
        if phase is None:
            return original(self, *args, **kwargs)
        try:
            return original(self, *args, **kwargs)
        finally:
            if rec is active.current:
                rec.modules.call_exit(phase)

    return __call__


def wrap_sync(kind: str, original: Callable) -> Callable:
    """A tensor method that records a host sync at the user's line (see module docstring)."""
    if kind in _NO_ARG_SYNCS:
        return _wrap_sync_no_args(kind, original)

    def method(self, *args, **kwargs):
        rec = active.current
        if rec is None or rec.busy:
            return original(self, *args, **kwargs)
        frame = sys._getframe(1)
        if USER_FILES.get(frame.f_code.co_filename) is False and not rec.gpu:
            return original(self, *args, **kwargs)  # torch's own call (an optimizer reading its step count)
        if rec.gpu:
            site = user_site(frame) if self.is_cuda else None
        else:
            # Cheapest test first: torch's own calls (an optimizer reading its step count) are not syncs.
            site = caller_site(frame)
        if site is None or _get_ident() != rec.thread or _compiling():
            return original(self, *args, **kwargs)
        rec.busy = True
        rec.push("sync")
        try:
            return original(self, *args, **kwargs)
        finally:
            seconds = rec.pop()
            rec.busy = False
            tally = rec.tally(f"sync:{kind}", site)
            tally.add(rec.step_index, seconds)

    method.__name__ = getattr(original, "__name__", kind)
    method.__doc__ = getattr(original, "__doc__", None)
    return method


_NO_ARG_SYNCS = frozenset({"item", "tolist", "bool", "float", "int"})


def _wrap_sync_no_args(kind: str, original: Callable) -> Callable:
    """:func:`wrap_sync` for methods without arguments: ``.item()`` runs inside torch's own optimizers for
    every parameter, so the path that lets those calls through is kept as short as it can be."""

    def method(self):
        rec = active.current
        if rec is None or rec.busy:
            return original(self)
        frame = sys._getframe(1)
        if not rec.gpu and USER_FILES.get(frame.f_code.co_filename) is False:
            return original(self)
        site = (user_site(frame) if self.is_cuda else None) if rec.gpu else caller_site(frame)
        if site is None or _get_ident() != rec.thread or _compiling():
            return original(self)
        rec.busy = True
        rec.push("sync")
        try:
            return original(self)
        finally:
            seconds = rec.pop()
            rec.busy = False
            rec.tally(f"sync:{kind}", site).add(rec.step_index, seconds)

    method.__name__ = getattr(original, "__name__", kind)
    method.__doc__ = getattr(original, "__doc__", None)
    return method
