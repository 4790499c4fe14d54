"""Where a training step's memory goes: its parts in bytes and its peak. Graphs kept alive across steps are
:mod:`.graph_watch`'s, out-of-memory errors :mod:`.out_of_memory`'s.

The peak is measured the same way on every device: a dispatch mode sees every storage an op returns and a
weak reference sees it freed, so the live bytes the step allocated are known after every op; the peak is
what was resident when the step began (parameters, buffers, gradients, optimizer state, the batch) plus the
most the step's own tensors held at once. It cannot see memory an op allocates and frees inside itself (a
kernel's workspace) nor what the allocator keeps cached; on CUDA the allocator's own peak is reported beside
it (``torch.cuda.max_memory_allocated``), and the cache it holds beyond live tensors (reserved - allocated).
On the CPU the allocator's cache is not known, and is reported as None.
"""

from __future__ import annotations

import inspect
import math
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import astuple, dataclass, replace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ...data.transfer import tensors_in
from .measurements import MemoryPhase
from .memory_limit import active, enforced
from ..module_stacks import stack_of
from ..sites import Site, is_user_file, user_site

__all__ = [
    "DeviceMemory",
    "ModuleActivations",
    "PeakSplit",
    "StepMemory",
    "device_memory",
    "measure_step",
    "storages",
    "resident_bytes",
    "Optimizers",
    "LossFn",
]

Optimizers = Sequence[torch.optim.Optimizer]
LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """The device's memory now. ``allocated``/``reserved`` are the CUDA caching allocator's (None on the CPU)."""

    device: str
    total_bytes: int | None
    free_bytes: int | None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    source: str = ""
    limit_bytes: int | None = None  # --memory-limit: what the step may hold here (total_bytes is that too)


@dataclass(frozen=True, slots=True)
class ModuleActivations:
    """Bytes saved for backward while ``name`` (qualified, "" for the root) was the innermost running module
    (``self_bytes``) and while it or a submodule was (``total_bytes``)."""

    name: str
    class_name: str
    self_bytes: int
    total_bytes: int
    tensors: int
    site: Site | None = None  # the user's ``forward`` of the module's class
    call: Site | None = None  # the user's line that called the module (in its parent's forward), where one did
    # One of torch's dropout or activation modules: recomputed alone it keeps its input in place of what it saved (a
    # mask, an output the next layer reads and saves itself), so checkpointing it gains nothing.
    elementwise: bool = False


@dataclass(frozen=True, slots=True)
class PeakSplit:
    """What was live at the step's peak, by kind. ``gradients`` and ``optimizer_state`` include those resident
    before the step; ``temporaries`` is every other tensor the step's ops had made and still held."""

    parameters: int
    buffers: int
    inputs: int
    gradients: int
    optimizer_state: int
    activations: int
    temporaries: int


@dataclass(frozen=True, slots=True)
class StepMemory:
    """One training step's memory. Sizes after the step; ``peak`` at its peak (see the module's docstring)."""

    device: str
    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    input_bytes: int
    activation_bytes: int  # saved for backward by the step's forward, each storage once
    modules: tuple[ModuleActivations, ...]  # by total_bytes, largest first: a prefix keeps every ancestor; a
    # stack's blocks are all kept or none
    peak: PeakSplit
    peak_bytes: int
    peak_phase: MemoryPhase
    allocator_peak_bytes: int | None  # CUDA: resident + (max_memory_allocated - allocated at the start)
    allocator_reserved_peak_bytes: int | None  # CUDA: max_memory_reserved, the whole process
    allocator_held_bytes: int | None  # CUDA: reserved - allocated after the step; None: not known on the CPU
    memory: DeviceMemory
    # (bytes that stay with the batch's size, bytes that grow with it) live at the step's candidate peaks: the
    # points no other point exceeds in both (:func:`frontier`); () where not measured (read from ``peak``).
    frontier: tuple[tuple[int, int], ...] = ()

    def at_rows(self, rows: int, full_rows: int) -> int:
        """The step's peak measured at ``rows``, estimated at ``full_rows``: at each candidate peak the batch-sized
        bytes scaled linearly (a peak in the optimizer at a small batch is one in the backward at a large one)."""
        points = self.frontier or (_resident_split(self.peak),)
        extra = max(0, (self.allocator_peak_bytes or self.peak_bytes) - self.peak_bytes)  # CUDA's workspaces
        return extra + max(fixed + math.ceil(grows * full_rows / max(rows, 1)) for fixed, grows in points)


# -- the device ---------------------------------------------------------------------------------------------


def device_memory(device: torch.device | str) -> DeviceMemory:
    """The device's total and free memory (CPU: available RAM), and on CUDA its allocator's counters; under
    --memory-limit, the device the doctor was told to pretend: its size the limit, its free part what is left."""
    memory = _device_memory(torch.device(device))
    limit = active()
    if limit is None or torch.device(limit.device).type != torch.device(device).type:
        return memory
    left = max(0, limit.limit_bytes - limit.used_bytes())
    return replace(
        memory, total_bytes=limit.limit_bytes, free_bytes=left, source="--memory-limit", limit_bytes=limit.limit_bytes
    )


def _device_memory(device: torch.device) -> DeviceMemory:
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
        return DeviceMemory(str(device), total, free, allocated, reserved, "torch.cuda.mem_get_info")
    if device.type == "cpu":
        return _cpu_memory()
    return DeviceMemory(str(device), None, None, source="not known for this device")


def _cpu_memory() -> DeviceMemory:
    try:
        import psutil

        vm = psutil.virtual_memory()
        return DeviceMemory("cpu", int(vm.total), int(vm.available), source="psutil.virtual_memory")
    except ImportError:
        info = _meminfo()
        total, free = info.get("MemTotal"), info.get("MemAvailable")
        return DeviceMemory("cpu", total, free, source="/proc/meminfo" if total else "not known")


def _meminfo() -> dict[str, int]:
    try:
        with open("/proc/meminfo") as f:
            rows = [line.split() for line in f]
    except OSError:
        return {}
    return {row[0].rstrip(":"): int(row[1]) * 1024 for row in rows if len(row) >= 2 and row[1].isdigit()}


# -- one step ----------------------------------------------------------------------------------------------


def storages(tensors: Iterable[torch.Tensor]) -> dict[int, int]:
    """data_ptr -> bytes of each distinct strided storage (views of one storage count once)."""
    out = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.layout is torch.strided and t.device.type != "meta":
            try:
                st = t.untyped_storage()
                ptr = st.data_ptr()
            except (RuntimeError, NotImplementedError):
                continue  # a tensor with no memory of its own: torch.compile's fake tensors, functional wrappers
            if ptr:
                out[ptr] = st.nbytes()
    return out


def resident_bytes(model: torch.nn.Module, optimizers: Optimizers, batches: Sequence[Any]) -> int:
    """What a step starts from, held before it and after it: parameters, buffers, gradients, optimizer state and
    the batch, each storage once."""
    held = [*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters() if p.grad is not None)]
    held += [*_optimizer_tensors(optimizers), *(t for b in batches for t in tensors_in(b))]
    return sum(storages(held).values())


def _optimizer_tensors(optimizers: Optimizers) -> list[torch.Tensor]:
    return [t for opt in optimizers for state in opt.state.values() for t in tensors_in(state)]


class _Timeline(TorchDispatchMode):
    """Every storage the step's ops return, when it is freed, and in which phase; its saved and its gradient
    labels come from outside."""

    def __init__(self) -> None:
        super().__init__()
        self.phase: MemoryPhase = "forward"
        self.by_ptr: dict[int, int] = {}  # data_ptr -> serial, while live
        self.sizes: list[int] = []  # serial -> bytes
        self.events: list[tuple[int, int, MemoryPhase]] = []  # (serial, +bytes or -bytes, phase)
        self._finalizers: list[weakref.finalize] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        seen = storages(t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.layout is torch.strided and t.device.type != "meta":
                self._note(t.untyped_storage(), seen)
        return out

    def _note(self, storage: torch.UntypedStorage, inputs: dict[int, int]) -> None:
        ptr = storage.data_ptr()
        if not ptr or ptr in inputs or ptr in self.by_ptr:
            return  # a view or an in-place result: nothing new
        serial = len(self.sizes)
        self.sizes.append(storage.nbytes())
        self.by_ptr[ptr] = serial
        self.events.append((serial, storage.nbytes(), self.phase))
        self._finalizers.append(weakref.finalize(storage, self._freed, ptr, serial))

    def _freed(self, ptr: int, serial: int) -> None:
        if self.by_ptr.get(ptr) == serial:
            del self.by_ptr[ptr]
        self.events.append((serial, -self.sizes[serial], self.phase))

    def close(self) -> None:
        for f in self._finalizers:
            f.detach()  # storages that outlive the step must not call back into a finished timeline

    def peak(self) -> tuple[set[int], MemoryPhase]:
        """The serials live at the step's peak, and the phase it fell in."""
        live = best = 0
        at = -1
        phase: MemoryPhase = "forward"
        for i, (_, delta, when) in enumerate(self.events):
            live += delta
            if live > best:
                best, at, phase = live, i, when
        held: set[int] = set()
        for serial, delta, _ in self.events[: at + 1]:
            (held.add if delta > 0 else held.discard)(serial)
        return held, phase


class _SavedByModule:
    """Saved-for-backward storages the step allocated, each once, keyed by the innermost running module."""

    def __init__(self, model: torch.nn.Module, timeline: _Timeline) -> None:
        self.timeline = timeline
        self.names = {id(m): name for name, m in model.named_modules()}
        self.stack: list[str] = []
        self.serials: set[int] = set()
        self.by_module: dict[str | None, list[int]] = {}  # name (None: outside the model) -> [bytes, tensors]
        self.called: dict[str, Site | None] = {}  # the modules whose forward ran (a ModuleList's never does): the
        # user's line that first called each (the parent's forward; None for the root, which the doctor calls)

    @contextmanager
    def hooked(self, model: torch.nn.Module) -> Iterator[None]:
        handles = []
        for module in model.modules():
            handles.append(module.register_forward_pre_hook(self._enter))
            handles.append(module.register_forward_hook(self._leave, always_call=True))
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
                yield
        finally:
            for h in handles:
                h.remove()

    def _enter(self, module: torch.nn.Module, args: Any) -> None:
        name = self.names.get(id(module), "")
        if name not in self.called:
            self.called[name] = user_site(sys._getframe(1))
        self.stack.append(name)

    def _leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.stack.pop()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        serial = self.timeline.by_ptr.get(t.untyped_storage().data_ptr()) if t.layout is torch.strided else None
        if serial is not None and serial not in self.serials:
            self.serials.add(serial)
            row = self.by_module.setdefault(self.stack[-1] if self.stack else None, [0, 0])
            row[0] += self.timeline.sizes[serial]
            row[1] += 1
        return t  # returned as is: the hooks only look


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _module_rows(
    model: torch.nn.Module, by_module: dict[str | None, list[int]], called: dict[str, Site | None], top: int
) -> tuple[ModuleActivations, ...]:
    """A row per module that ran: a container never called (a ``ModuleList``) cannot be recomputed as one, its
    children's rows stand for it."""
    totals: dict[str, list[int]] = {}
    for name, (nbytes, count) in by_module.items():
        if name is None:
            continue  # the loss's own saves: in activation_bytes, under no module
        parts = name.split(".") if name else []
        for depth in range(len(parts) + 1):
            row = totals.setdefault(".".join(parts[:depth]), [0, 0])
            row[0] += nbytes
            row[1] += count
    modules = dict(model.named_modules())
    rows = [
        ModuleActivations(
            name,
            type(modules[name]).__name__,
            by_module.get(name, [0])[0],
            total,
            count,
            _class_site(modules[name]),
            called[name],
            _elementwise(modules[name]),
        )
        for name, (total, count) in totals.items()
        if name in modules and name in called
    ]
    rows.sort(key=lambda r: (-r.total_bytes, r.name))
    # A stack is checkpointed whole: the blocks of a stack the cut reaches all stay (a 48-layer model's last blocks
    # rank below the cut only because each holds what the others do).
    stacks = {(found[0], r.class_name) for r in rows[:top] if (found := stack_of(r.name))}
    kept = rows[:top] + [r for r in rows[top:] if (found := stack_of(r.name)) and (found[0], r.class_name) in stacks]
    return tuple(kept)


def _elementwise(module: torch.nn.Module) -> bool:
    dropout = isinstance(module, torch.nn.modules.dropout._DropoutNd)
    return (
        dropout or type(module).__module__ == "torch.nn.modules.activation" and next(module.parameters(), None) is None
    )


def _class_site(module: torch.nn.Module) -> Site | None:
    """The user's ``forward`` of the module's class; None for library classes."""
    forward = type(module).forward
    try:
        file = inspect.getsourcefile(forward)
        line = inspect.getsourcelines(forward)[1]
    except (OSError, TypeError):
        return None
    return Site(file, line, f"{type(module).__name__}.forward") if file and is_user_file(file) else None


def measure_step(
    model: torch.nn.Module,
    optimizers: Optimizers,
    batches: Sequence[Any],
    loss_fn: LossFn,
    *,
    set_to_none: bool = True,
    top: int = 32,
) -> StepMemory:
    """Train ``model`` one step (it and its optimizers change: pass copies to keep the originals) and measure
    it: ``zero_grad(set_to_none)``, then forward and backward of ``loss_fn(model, batch) / len(batches)`` for
    each micro-batch, then every optimizer's step."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    for opt in optimizers:
        opt.zero_grad(set_to_none=set_to_none)
    params, buffers = storages(model.parameters()), storages(model.buffers())
    inputs = storages(t for b in batches for t in tensors_in(b))
    grads_before = storages(p.grad for p in model.parameters() if p.grad is not None)
    state_before = storages(_optimizer_tensors(optimizers))
    resident = sum({**params, **buffers, **inputs, **grads_before, **state_before}.values())
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        allocated_at_start = torch.cuda.memory_allocated(device)
    timeline = _Timeline()
    saved = _SavedByModule(model, timeline)
    try:
        # Under --memory-limit the step must fit as the script's had to (the original model beside this copy,
        # and what the doctor holds, are not counted).
        # Eager: Dynamo skips frames under the timeline's dispatch mode, and a fullgraph=True function (nanochat's
        # compiled optimizer steps) raises there instead; the ops the timeline counts are eager ops anyway.
        with enforced(held_bytes=resident), timeline, saved.hooked(model), torch.compiler.set_stance("force_eager"):
            _train_step(model, optimizers, batches, loss_fn, timeline)
        held, phase = timeline.peak()
    finally:
        timeline.close()
    grads = storages(p.grad for p in model.parameters() if p.grad is not None)
    state = storages(_optimizer_tensors(optimizers))
    split = _split(timeline, held, saved.serials, grads, state, params, buffers, inputs, grads_before, state_before)
    stays = {timeline.by_ptr[p] for p in (*grads, *state) if p in timeline.by_ptr}
    stays |= {serial for serial, delta, phase in timeline.events if delta > 0 and phase == "optimizer"}
    staying = {**params, **buffers, **grads_before, **state_before}
    grows = sum(v for p, v in inputs.items() if p not in staying)
    points = frontier(timeline, stays, sum(staying.values()), grows)
    memory = device_memory(device)
    held_by_cache = None
    if cuda:
        torch.cuda.synchronize(device)
        allocator_peak = resident + torch.cuda.max_memory_allocated(device) - allocated_at_start
        reserved_peak = torch.cuda.max_memory_reserved(device)
        held_by_cache = (memory.reserved_bytes or 0) - (memory.allocated_bytes or 0)
    return StepMemory(
        str(device),
        sum(params.values()),
        sum(buffers.values()),
        sum(grads.values()),
        sum(state.values()),
        sum(inputs.values()),
        sum(timeline.sizes[s] for s in saved.serials),
        _module_rows(model, saved.by_module, saved.called, top),
        split,
        sum(astuple(split)),
        phase,
        allocator_peak if cuda else None,
        reserved_peak if cuda else None,
        held_by_cache,
        memory,
        points,
    )


def _resident_split(peak: PeakSplit) -> tuple[int, int]:
    """A peak's bytes that stay with the batch's size (parameters, buffers, gradients, optimizer state) and the rest."""
    fixed = peak.parameters + peak.buffers + peak.gradients + peak.optimizer_state
    return fixed, sum(astuple(peak)) - fixed


def frontier(timeline: _Timeline, fixed: set[int], fixed_start: int, grows_start: int) -> tuple[tuple[int, int], ...]:
    """(bytes that stay, bytes that grow with the batch) live after each of the step's allocations and frees, kept
    where no other point holds as much of both: the largest ``stay + k * grow`` among them is the step's peak at ``k``
    times its rows. ``fixed``: the serials that stay (gradients, optimizer state, what the optimizer allocates)."""
    stay, grow = fixed_start, grows_start
    points = [(stay, grow)]
    for serial, delta, _ in timeline.events:
        if serial in fixed:
            stay += delta
        else:
            grow += delta
        points.append((stay, grow))
    kept: list[tuple[int, int]] = []
    for point in sorted(set(points), key=lambda p: (-p[0], -p[1])):
        if not kept or point[1] > kept[-1][1]:
            kept.append(point)
    return tuple(kept)


def _train_step(
    model: torch.nn.Module, optimizers: Optimizers, batches: Sequence[Any], loss_fn: LossFn, timeline: _Timeline
) -> None:
    for batch in batches:
        timeline.phase = "forward"
        loss = loss_fn(model, batch) / len(batches)
        timeline.phase = "backward"
        loss.backward()
    timeline.phase = "optimizer"
    for opt in optimizers:
        opt.step()


def _split(
    timeline: _Timeline,
    held: set[int],
    saved: set[int],
    grads: dict[int, int],
    state: dict[int, int],
    params: dict[int, int],
    buffers: dict[int, int],
    inputs: dict[int, int],
    grads_before: dict[int, int],
    state_before: dict[int, int],
) -> PeakSplit:
    grad_serials = {timeline.by_ptr[p] for p in grads if p in timeline.by_ptr}
    state_serials = {timeline.by_ptr[p] for p in state if p in timeline.by_ptr}

    def held_bytes(serials: set[int]) -> int:
        return sum(timeline.sizes[s] for s in held & serials)

    kinds = grad_serials | state_serials | saved
    return PeakSplit(
        parameters=sum(params.values()),
        buffers=sum(buffers.values()),
        inputs=sum(inputs.values()),
        gradients=sum(grads_before.values()) + held_bytes(grad_serials),
        optimizer_state=sum(state_before.values()) + held_bytes(state_serials),
        activations=held_bytes(saved - grad_serials - state_serials),
        temporaries=sum(timeline.sizes[s] for s in held - kinds),
    )
