"""The wrappers a recording installs around torch calls (all undone by the recorder's Patcher).

Every wrapper starts with the same cheap test (a recording is active, on the script's own
thread, not inside torch.compile's tracing) and otherwise calls the original unchanged.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from . import active
from .measurements import Phase
from .patcher import Patcher
from .tallies import LoaderTally
from ..sites import USER_FILES, Site, caller_site, user_site

__all__ = ["install", "measured_call", "direct_forward", "hooked", "wrap_sync", "SYNC_METHODS"]

if TYPE_CHECKING:
    from types import FrameType

    from .probe import Probe

SYNC_METHODS = (
    "item",
    "tolist",
    "numpy",
    "cpu",
    "nonzero",
    "__bool__",
    "__float__",
    "__int__",
    "__repr__",
    "__format__",
)

_get_ident = threading.get_ident
_perf = active.perf_counter
_compiling = active.compiling


def _live() -> Probe | None:
    """The active recording's probe when this call should be recorded, else None."""
    probe = active.current
    # Compiling first: torch.compile traces what comes before it, and a thread id breaks the user's graph.
    if _compiling() or probe is None or probe.busy or _get_ident() != probe.thread:
        return None
    return probe


# -- phases -----------------------------------------------------------------------------------------


def _phase(
    phase: Phase,
    original: Callable,
    on_enter: Callable | None = None,
    untimed_ok: bool = False,
    on_exit: Callable | None = None,
) -> Callable:
    """Time ``original`` as ``phase``. With ``untimed_ok`` (the backward: its time is compute either way,
    as untimed time after the forward) only the bookkeeping runs, unless a trace range or device time
    is wanted. ``on_exit(probe)`` runs after a call that returned."""

    def wrapper(*args, **kwargs):
        probe = _live()
        if probe is None:
            return original(*args, **kwargs)
        if on_enter is not None:
            on_enter(probe)
        # The hot path: plain attribute reads, no property calls.
        untimed = untimed_ok and not probe.profiling and not probe.gpu
        if untimed and probe.steps.open_step.marks and not probe.clock.frames:
            out = original(*args, **kwargs)
        else:
            probe.clock.push(phase)
            if probe.gpu:
                probe.gpu_mark(phase, True)
            try:
                out = original(*args, **kwargs)
            finally:
                if probe.gpu:
                    probe.gpu_mark(phase, False)
                probe.clock.pop()
        if on_exit is not None:
            on_exit(probe)
        return out

    wrapper.__name__ = getattr(original, "__name__", phase)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]  # a function takes attributes; Callable hides it
    return wrapper


def _copy(original: Callable) -> Callable:
    """``Tensor.to`` / ``Tensor.cuda``: host-to-device copies (a device-to-host one is a sync)."""

    def method(self, *args, **kwargs):
        probe = _live()
        if probe is None:
            return original(self, *args, **kwargs)
        src = self.device
        probe.clock.push("h2d")
        out = None
        try:
            out = original(self, *args, **kwargs)
        finally:
            moved = isinstance(out, torch.Tensor) and out.device != src
            to_host = moved and out.device.type == "cpu"
            seconds = probe.clock.pop(("sync" if to_host else "h2d") if moved else None)
        if moved:
            frame = sys._getframe(1)
            site = user_site(frame)
            if to_host:
                tally = probe.tallies.tally("sync:to_cpu", site)
            else:
                tally = probe.tallies.tally("h2d", site)
                if tally is not None and not tally.detail:
                    tally.detail["non_blocking"] = bool(kwargs.get("non_blocking")) or any(a is True for a in args)
                    tally.detail["pinned"] = bool(src.type == "cpu" and probe.gpu and self.is_pinned())
            if tally is not None:
                tally.add(probe.steps.step_index, seconds, self.numel() * self.element_size())
        return out

    method.__name__ = original.__name__
    method.__doc__ = original.__doc__
    return method


def _zero_grad(original: Callable) -> Callable:
    def zero_grad(self, *args, **kwargs):
        probe = _live()
        if probe is None:
            return original(self, *args, **kwargs)
        set_to_none = kwargs.get("set_to_none", args[0] if args else True)
        opened = probe.steps.open_step
        probe.tallies.zero_grads["before_backward" if opened.forwards and not opened.backwards else "elsewhere"] += 1
        probe.clock.push("optimizer")
        try:
            return original(self, *args, **kwargs)
        finally:
            probe.clock.pop()
            if not set_to_none:
                tally = probe.tallies.tally("zero_grad_zeros", user_site(sys._getframe(1)))
                if tally is not None:
                    tally.add(probe.steps.step_index)

    zero_grad.__doc__ = original.__doc__
    return zero_grad


def _timed_site(kind: str, phase: Phase | None, original: Callable) -> Callable:
    """Calls counted (and timed) per site: torch.save, empty_cache, torch.compile, ..."""

    def wrapper(*args, **kwargs):
        probe = _live()
        if probe is None:
            return original(*args, **kwargs)
        site = user_site(sys._getframe(1))
        if phase:
            probe.clock.push(phase)
        started = _perf()
        try:
            return original(*args, **kwargs)
        finally:
            seconds = probe.clock.pop() if phase else _perf() - started
            tally = probe.tallies.tally(kind, site)
            if tally is not None:
                tally.add(probe.steps.step_index, seconds)

    wrapper.__name__ = getattr(original, "__name__", kind)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]  # a function takes attributes; Callable hides it
    return wrapper


def _frames_up_one_more(script: Callable) -> Callable:
    """``torch.jit.script`` resolving names from its caller's caller: the wrapper around it is one frame more,
    and TorchScript reads the globals and locals of the frame ``_frames_up`` above its own."""

    def script_from_the_callers_frame(obj, optimize=None, _frames_up=0, _rcb=None, **kwargs):
        return script(obj, optimize, _frames_up + 2, _rcb, **kwargs)  # + this function + _timed_site's wrapper

    return script_from_the_callers_frame


# -- data ----------------------------------------------------------------------------------------------


def _in_phase(probe: Probe, phase: Phase, fn: Callable, *args: Any) -> tuple[Any, float]:
    """``fn(*args)`` timed as ``phase``: its result and its own seconds."""
    probe.clock.push(phase)
    try:
        out = fn(*args)
    except BaseException:
        probe.clock.pop()
        raise
    return out, probe.clock.pop()


def _loader_settings(loader: DataLoader) -> dict[str, Any]:
    dataset = loader.dataset
    try:
        length = len(dataset)  # type: ignore[arg-type]  # an IterableDataset may have no len: TypeError below
    except TypeError:
        length = None
    try:
        batches = len(loader)
    except TypeError:
        batches = None
    return {
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "persistent_workers": loader.persistent_workers,
        "batch_size": loader.batch_size,
        "prefetch_factor": loader.prefetch_factor,
        "dataset": type(dataset).__name__,
        "iterable": isinstance(dataset, IterableDataset),  # workers would each yield all of it, unless sharded
        "dataset_len": length,
        "batches_per_epoch": batches,
        "drop_last": loader.drop_last,
    }


def _loader_record(probe: Probe, loader: DataLoader, site: Site | None = None) -> LoaderTally:
    record = probe.tallies.loaders.get(id(loader))
    if record is None or record.loader is not loader:
        record = probe.tallies.loaders[id(loader)] = LoaderTally(loader, site, _loader_settings(loader))
    return record


def _loader_init(original: Callable) -> Callable:
    # The original's signature shows through: Lightning rebuilds a DataLoader (a DistributedSampler on DDP) from
    # the attributes matching ``DataLoader.__init__``'s parameters, and without them trains with batch size 1.
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        probe = _live()
        if probe is not None:
            caller = sys._getframe(1)
            site = caller_site(caller)
            if site is None:  # a framework rebuilt it (Lightning, for a DistributedSampler): the user's loader's line
                site = _site_of_loader_over(probe, self.dataset) or user_site(caller)
            _loader_record(probe, self, site)

    return __init__


def _site_of_loader_over(probe: Probe, dataset: Any) -> Site | None:
    return next((t.site for t in probe.tallies.loaders.values() if t.site and t.loader.dataset is dataset), None)


def _loader_iter(original: Callable) -> Callable:
    def __iter__(self):
        probe = _live()
        if probe is None:
            return original(self)
        probe.steps.step_starts()
        it, seconds = _in_phase(probe, "data", original, self)
        _loader_record(probe, self)
        try:
            it._tt_loader = id(self)
            it._tt_start = seconds  # worker start-up; the first batch's wait is added on next()
        except AttributeError:
            pass
        return it

    return __iter__


def _iter_next(original: Callable) -> Callable:
    def __next__(self):
        probe = _live()
        if probe is None:
            return original(self)
        probe.steps.step_starts()
        batch, seconds = _in_phase(probe, "data", original, self)
        record = probe.tallies.loaders.get(getattr(self, "_tt_loader", -1))
        if record is not None:
            record.nexts.add(probe.steps.step_index, seconds)
            record.iterator = weakref.ref(self)
            start = self.__dict__.pop("_tt_start", None)
            if start is not None:
                record.starts.append((probe.steps.step_index, start + seconds))
        return batch

    return __next__


def _tensor_factory(original: Callable) -> Callable:
    """``torch.tensor(ndarray)`` copies; ``torch.from_numpy`` would not."""

    def tensor(data, *args, **kwargs):
        probe = _live()
        if probe is None:
            return original(data, *args, **kwargs)
        if type(data).__module__ != "numpy" or not hasattr(data, "nbytes"):
            # What the user's line really passes (a list, a scalar): the NumPy rule stays quiet there.
            tally = probe.tallies.tally("tensor_other", caller_site(sys._getframe(1)))
            if tally is not None:
                tally.add(probe.steps.step_index)
            return original(data, *args, **kwargs)
        site = caller_site(sys._getframe(1))
        started = _perf()
        out = original(data, *args, **kwargs)
        tally = probe.tallies.tally("tensor_copy", site)
        if tally is not None:
            tally.add(probe.steps.step_index, _perf() - started, int(data.nbytes))
        return out

    tensor.__doc__ = original.__doc__
    tensor.__wrapped__ = original  # type: ignore[attr-defined]  # a function takes attributes; Callable hides it
    return tensor


# -- model structure -------------------------------------------------------------------------------------


def _softmax(original: Callable) -> Callable:
    def softmax(*args, **kwargs):
        probe = _live()
        if probe is None:
            return original(*args, **kwargs)
        probe.busy = True  # F.softmax calls Tensor.softmax: count the user's call once
        try:
            return original(*args, **kwargs)
        finally:
            probe.busy = False
            tally = probe.tallies.tally("softmax", user_site(sys._getframe(1)))
            if tally is not None:
                tally.add(probe.steps.step_index)
                if "shape" not in tally.detail and args and isinstance(args[0], torch.Tensor):
                    tally.detail["shape"] = tuple(args[0].shape)

    softmax.__doc__ = getattr(original, "__doc__", None)
    return softmax


def _matmul(original: Callable) -> Callable:
    """Operand shapes per user line, during warm-up only (sizes a measured attention what-if)."""

    def matmul(a, b, *args, **kwargs):
        probe = _live()
        tensors = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        if probe is not None and probe.modules.discovery and tensors:
            site = caller_site(sys._getframe(1))
            if site is not None:
                probe.tallies.matmul_shapes.setdefault(site, (tuple(a.shape), tuple(b.shape)))
        return original(a, b, *args, **kwargs)

    matmul.__doc__ = getattr(original, "__doc__", None)
    return matmul


def _module_init(original: Callable) -> Callable:
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        probe = active.current
        # Keyed by id, never by the module: a subclass may define __hash__ on attributes its own
        # __init__ has not set yet (torchmetrics does), and this runs inside that __init__.
        if probe is not None and _get_ident() == probe.thread and id(self) not in probe.tallies.module_sites:
            site = user_site(_building(sys._getframe(1), self))
            if site is not None:
                probe.tallies.module_sites[id(self)] = (weakref.ref(self), site)

    __init__.__doc__ = original.__doc__
    return __init__


def _building(frame: FrameType | None, module: object) -> FrameType | None:
    """The frame that builds ``module``: past its class's own ``__init__`` (and its bases'), whose
    ``super().__init__()`` line is not where the script made the model (``model = Policy()`` is)."""
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is module:
        frame = frame.f_back
    return frame


def _optimizer_init(original: Callable) -> Callable:
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        probe = active.current
        if probe is not None and _get_ident() == probe.thread:
            probe.steps.optimizer_created(self, user_site(sys._getframe(1)))

    __init__.__doc__ = original.__doc__
    return __init__


def _on_backward(probe: Probe) -> None:
    probe.modules.on_backward()


def _after_backward(probe: Probe) -> None:
    probe.steps.after_backward()


def _sync_wrapper(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return lambda original: wrap_sync(kind, original)


def install(patcher: Patcher) -> None:
    """Install every wrapper on ``patcher`` (restored when the recording ends)."""
    for name in SYNC_METHODS:
        patcher.replace(torch.Tensor, name, _sync_wrapper(name.strip("_")))
    patcher.replace(torch.Tensor, "to", _copy)
    patcher.replace(torch.Tensor, "cuda", _copy)
    patcher.replace(
        torch.autograd,
        "backward",
        lambda orig: _phase("backward", orig, _on_backward, untimed_ok=True, on_exit=_after_backward),
    )
    patcher.replace(torch.autograd, "grad", lambda orig: _phase("backward", orig))
    patcher.replace(torch.optim.Optimizer, "zero_grad", _zero_grad)
    patcher.replace(nn.Module, "zero_grad", _zero_grad)
    patcher.replace(torch, "save", lambda orig: _timed_site("save", "save", orig))
    patcher.replace(torch.cuda, "empty_cache", lambda orig: _timed_site("empty_cache", None, orig))
    patcher.replace(torch, "compile", lambda orig: _timed_site("compile", None, orig))
    patcher.replace(torch.jit, "script", lambda orig: _timed_site("jit", None, _frames_up_one_more(orig)))
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
    """``__call__`` for the class of an outermost module: see :mod:`turbotrain.doctor.record.discovery`."""

    def __call__(self, *args, **kwargs):
        probe = active.current
        if probe is None or id(self) not in probe.modules.top_ids or _get_ident() != probe.thread:
            return original(self, *args, **kwargs)
        phase = probe.modules.call_enter(self, args, kwargs)
        if phase is None:
            return original(self, *args, **kwargs)
        try:
            return original(self, *args, **kwargs)
        finally:
            if probe is active.current:
                probe.modules.call_exit(phase)

    return __call__


_fx_tracing = torch.fx._symbolic_trace.is_fx_symbolic_tracing
# A forward called from torch's module code is the module's own call: ``_call_impl``, the ``inner`` it runs where a
# module has hooks, ``jit.trace``'s ``_slow_forward``.
MODULE_FILE = sys.modules[nn.Module.__module__].__file__


def hooked(module: nn.Module) -> bool:
    """Whether ``module`` has module hooks of its own."""
    return bool(
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks
    )


def direct_forward(original: Callable) -> Callable:
    """``forward`` for the class of a trained module whose forward the script calls directly (``model.forward(x)``,
    which skips ``__call__`` and so every module hook): such a call goes through ``__call__``, so that the doctor sees
    the model's call, and the forward runs once, as written. A forward reached otherwise (the module's own call, a
    subclass's ``super().forward``, the forward calling itself, torch.compile's and torch.fx's tracing, a model with
    hooks of its own, which the script's direct call skips) runs unchanged. (Discovery routes no class with a
    ``__call__`` of its own.)"""
    active: set[int] = set()  # the instances whose forward (or routed call) is running: a call inside is theirs

    def run(self, args: tuple, kwargs: dict) -> Any:
        key = id(self)
        if key in active:
            return original(self, *args, **kwargs)
        active.add(key)
        try:
            return original(self, *args, **kwargs)
        finally:
            active.discard(key)

    @functools.wraps(original)  # its signature, for what reads it (torch.fx makes one proxy per parameter)
    def forward(self, *args, **kwargs):
        if _compiling() or _fx_tracing():  # torch.fx calls the root's forward itself, with proxies
            return original(self, *args, **kwargs)
        if (
            id(self) in active  # the forward calling itself (on chunks, recursively), or the routed call's own
            or hooked(self)  # the script's direct call skips the model's own hooks: routing would run them
            or getattr(type(self), "forward", None) is not forward  # a subclass's forward called super().forward
            or sys._getframe(1).f_code.co_filename == MODULE_FILE
        ):
            return run(self, args, kwargs)
        active.add(id(self))
        try:
            return self(*args, **kwargs)
        finally:
            active.discard(id(self))

    return forward


def wrap_sync(kind: str, original: Callable) -> Callable:
    """A tensor method that records a host sync at the user's line (see module docstring)."""
    if kind in _NO_ARG_SYNCS:
        return _wrap_sync_no_args(kind, original)

    def method(self, *args, **kwargs):
        probe = active.current
        if probe is None or probe.busy or _compiling():  # under compile, before the frame read that breaks a graph
            return original(self, *args, **kwargs)
        frame = sys._getframe(1)
        if USER_FILES.get(frame.f_code.co_filename) is False and not probe.gpu:
            return original(self, *args, **kwargs)  # torch's own call (an optimizer reading its step count)
        if probe.gpu:
            site = user_site(frame) if self.is_cuda else None
        else:
            # Cheapest test first: torch's own calls (an optimizer reading its step count) are not syncs.
            site = None if _loading(probe) else caller_site(frame)
        if site is None or _get_ident() != probe.thread:
            return original(self, *args, **kwargs)
        probe.busy = True
        probe.clock.push("sync")
        try:
            return original(self, *args, **kwargs)
        finally:
            seconds = probe.clock.pop()
            probe.busy = False
            tally = probe.tallies.tally(f"sync:{kind}", site)
            tally.add(probe.steps.step_index, seconds)

    method.__name__ = getattr(original, "__name__", kind)
    method.__doc__ = getattr(original, "__doc__", None)
    return method


_NO_ARG_SYNCS = frozenset({"item", "tolist", "bool", "float", "int"})


def _loading(probe: Probe) -> bool:
    """Inside a DataLoader's fetch (a Dataset's ``__getitem__``, its collate): the tensors read there are the
    host's on any device (``int(self.targets[i])``), no sync; on a CUDA run the ``is_cuda`` test leaves them out."""
    top = probe.clock.top
    return top is not None and top.phase == "data"


def _wrap_sync_no_args(kind: str, original: Callable) -> Callable:
    """:func:`wrap_sync` for methods without arguments: ``.item()`` runs inside torch's own optimizers for
    every parameter, so the path that lets those calls through is kept as short as it can be."""

    def method(self):
        probe = active.current
        if probe is None or probe.busy or _compiling():  # under compile, before the frame read that breaks a graph
            return original(self)
        frame = sys._getframe(1)
        if not probe.gpu and USER_FILES.get(frame.f_code.co_filename) is False:
            return original(self)
        if probe.gpu:
            site = user_site(frame) if self.is_cuda else None
        else:
            site = None if _loading(probe) else caller_site(frame)
        if site is None or _get_ident() != probe.thread:
            return original(self)
        probe.busy = True
        probe.clock.push("sync")
        try:
            return original(self)
        finally:
            seconds = probe.clock.pop()
            probe.busy = False
            probe.tallies.tally(f"sync:{kind}", site).add(probe.steps.step_index, seconds)

    method.__name__ = getattr(original, "__name__", kind)
    method.__doc__ = getattr(original, "__doc__", None)
    return method
