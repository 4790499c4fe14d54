"""The outermost module calls of a step: which modules they are, and what each call is.

Global module hooks (which slow every module call, and send any module down torch's slow call
path) run only in the first warm-up steps, to find the outermost modules. After that, those
modules' classes get a ``__call__`` (:func:`turbotrain.doctor.record.instrument.measured_call`) that
checks for those very instances: a training forward just marks where the batch was ready (its
time is compute, like the rest of the step after it); a validation forward is timed apart. The
classes are restored when the recording ends (instances, copies and pickles never carry anything
of the doctor's). A script whose compiled code traced the hooks keeps them, inert, until the end: torch
guards its graphs on the number of global hooks, and removing them would recompile every compiled function.

A call is a training forward, a validation forward without autograd (``eval``), or an eval-mode
forward with autograd on (``eval_grad``, charged as training if a backward follows it).
"""

from __future__ import annotations

import re
import sys
import warnings
from collections import defaultdict
import threading
import weakref
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from . import active, instrument
from .forward_facts import capture_inputs, forward_facts
from .recording import Capture
from .measurements import ForwardFacts, Phase
from ..sites import user_site

if TYPE_CHECKING:  # pragma: no cover
    from types import CodeType, FrameType

    from .patcher import Patcher
    from .probe import Probe

__all__ = ["ModuleCalls"]

get_ident = threading.get_ident

# torch warns, at each compiled module's call, that global module hooks fire for its OptimizedModule too: the hooks
# are the doctor's (its depth count sees the wrapper and the module as one call), so the warning is not the user's.
_HOOKS_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


def _quiet_torch_about_the_hooks(on: bool) -> None:
    if on:
        warnings.filterwarnings("ignore", message=_HOOKS_WARNING, category=UserWarning)
        return
    ours = ("ignore", re.compile(_HOOKS_WARNING, re.IGNORECASE), UserWarning)
    filters: list[Any] = warnings.filters  # type: ignore[assignment]  # a list at run time; typeshed says Sequence
    filters[:] = [f for f in filters if f[:3] != ours]
    # What filterwarnings() calls: warnings already decided at a line are decided again (CPython's own hook).
    getattr(warnings, "_filters_mutated", lambda: None)()


class ModuleCalls:
    """Finds and classifies the outermost module calls of a recording's steps; holds the forward facts and
    the captured batch the what-ifs replay."""

    def __init__(self, probe: Probe, patcher: Patcher, capture: bool) -> None:
        self.probe, self.patcher = probe, patcher
        self.want_capture = capture
        self.discovery = True
        self.top_modules: dict[int, weakref.ReferenceType] = {}
        self.top_ids: set[int] = set()
        self.facts: ForwardFacts | None = None
        self.capture: Capture | None = None
        # The inputs of the first eval-mode forward with autograd on (a validation batch): its what-if
        # times the forward on them, since validation batches are often larger than training ones.
        self.eval_grad_inputs: tuple[tuple, dict] | None = None
        self._facts_final = self._capture_final = False
        self._hook_handles: list[Any] = []
        self.traced_by_compile = False  # torch.compile traced the global hooks (and guards on their number)
        # The modules were found in a warm-up step run eagerly: the script calls them only inside compiled code,
        # where a wrapped __call__ would be traced into its graphs, so none is wrapped.
        self.looked_eagerly = False
        self._wrapped_classes: set[type] = set()
        # The classes whose forward the script calls directly: the code of their own forward (now wrapped).
        self._routed_classes: dict[type, CodeType] = {}
        self._depth = 0
        self._top_phases: list[Phase] = []
        self._last_top_phase: Phase | Literal[""] = ""
        self._gpu_forward_open = False
        self._trained_ids: set[int] | None = None
        self._trained_cache: dict[int, bool] = {}
        # Elements of the tensors each step's training forwards took: ranks given batches of other sizes.
        self.input_numel: defaultdict[int, int] = defaultdict(int)

    # -- which modules -----------------------------------------------------------------------------

    def set_discovery(self, on: bool, attach: bool = True) -> None:
        """Global module hooks (``on``), or a light wrapper on just the outermost modules found (``attach``)."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        if not on and attach and self.traced_by_compile and self._hook_handles:
            # torch.compile guarded its graphs on the number of global hooks: removing them would recompile every
            # compiled function once (recompiles that were the doctor's, not the script's). They stay, inert.
            self.discovery = False
        else:
            if self._hook_handles:
                _quiet_torch_about_the_hooks(False)
            for handle in self._hook_handles:
                handle.remove()
            self._hook_handles = []
            self.discovery = on
        if on:
            _quiet_torch_about_the_hooks(True)
            self._hook_handles = [
                register_module_forward_pre_hook(self._forward_pre),
                register_module_forward_hook(self._forward_post, always_call=True),
            ]
        elif attach and not self.looked_eagerly:
            for ref in self.top_modules.values():
                module = ref()
                if module is None:
                    continue
                self.top_ids.add(id(module))
                cls = type(module)
                if cls not in self._wrapped_classes:
                    self._wrapped_classes.add(cls)
                    self.patcher.replace(cls, "__call__", instrument.measured_call)
        self._depth = 0
        self._top_phases.clear()

    def is_trained(self, module: nn.Module) -> bool:
        """Whether an optimizer updates ``module``'s parameters (without optimizers: whether it has trainable ones)."""
        key = id(module)
        cached = self._trained_cache.get(key)
        if cached is not None:
            return cached
        if self._trained_ids is None:
            self._trained_ids = {
                id(p)
                for opt in self.probe.tallies.live_optimizers()
                for group in opt.param_groups
                for p in group["params"]
            }
        if self._trained_ids or self.probe.steps.optimizer_delimits:
            trained = any(id(p) in self._trained_ids for p in module.parameters())
        else:  # weights updated by hand: the model is whatever has trainable parameters
            trained = any(p.requires_grad for p in module.parameters())
        self._trained_cache[key] = trained
        return trained

    def forget_trained(self) -> None:
        """The optimizers changed (or steps are now delimited by backward): ask again."""
        self._trained_ids = None
        self._trained_cache.clear()

    def classify(self, module: nn.Module) -> tuple[Phase, bool]:
        trained = self.is_trained(module)
        if trained and (not torch.is_grad_enabled() or torch.is_inference_mode_enabled()):
            return "eval", trained
        if trained and not module.training:
            return "eval_grad", trained
        return "forward", trained

    # -- measured steps: the wrapped __call__ -------------------------------------------------------

    def call_enter(self, module: nn.Module, args: tuple, kwargs: dict) -> Phase | None:
        """An outermost module is called (measured steps): the phase to time it as, or None."""
        rec = self.probe
        phase, trained = self.classify(module)
        if rec.steps.pending_update and phase == "forward" and trained:
            rec.steps.step_starts()
        # A forward inside another timed phase (Lightning runs it in optimizer.step's closure) is
        # timed itself; otherwise its time is the untimed compute after the mark.
        if phase == "forward" and not rec.profiling and not rec.clock.frames:
            if trained:
                self._training_forward(module, args, kwargs, active.perf_counter())
            self._last_top_phase = "forward"
            return None
        if phase == "eval":
            self._note_eval_site()
        elif phase == "eval_grad" and self.eval_grad_inputs is None:
            self.eval_grad_inputs = (args, dict(kwargs))
        rec.clock.push(phase)  # a validation forward, or any forward in the profiler window (its trace range)
        if phase == "forward" and trained:
            self._training_forward(module, args, kwargs, rec.clock.frames[-1].running_since)
        return phase

    def call_exit(self, phase: Phase) -> None:
        seconds = self.probe.clock.pop()
        if phase == "eval_grad":
            self.probe.steps.open_step.pending_eval_grad.append((user_site(sys._getframe(2)), seconds))
        self._last_top_phase = phase

    def on_backward(self) -> None:
        """Called at the start of a backward: an eval-mode forward just before it was training after all."""
        rec = self.probe
        opened = rec.steps.open_step
        opened.backwards += 1
        if self._gpu_forward_open:
            rec.gpu_mark("forward", False)
            self._gpu_forward_open = False
        if self._last_top_phase == "eval_grad" and opened.pending_eval_grad:
            _, seconds = opened.pending_eval_grad.pop()
            rec.clock.recharge("eval_grad", "forward", seconds)
        self._last_top_phase = "backward"

    # -- warm-up: the global hooks ------------------------------------------------------------------

    def _forward_pre(self, module: nn.Module, args: tuple) -> None:
        rec = self.probe
        # Compiling first: torch.compile traces what comes before it, and a thread id breaks the user's graph.
        if active.compiling():
            self.traced_by_compile = True
            return
        if not self.discovery or active.current is not rec or get_ident() != rec.thread:
            return
        if torch.is_grad_enabled():  # the step's own: not an evaluation's (nanoGPT's estimate_loss in its first step)
            rec.steps.open_step.module_calls += 1
        self._depth += 1
        if self._depth != 1:
            return
        owner = self._direct_forward_owner(module)
        if owner is None:
            self.top_modules.setdefault(id(module), weakref.ref(module))
        elif type(owner) in self._routed_classes and id(owner) in self.top_modules:
            return  # another child of the direct forward just routed: that forward counts once, as its first child
        else:  # the script called owner.forward(x): owner is the model, seen whole from its next call
            self._route_direct_forward(owner)
        phase, trained = self.classify(module)
        if rec.steps.pending_update and phase == "forward" and trained:
            rec.steps.step_starts()
        if phase == "eval":
            self._note_eval_site()
        elif phase == "eval_grad" and self.eval_grad_inputs is None:
            self.eval_grad_inputs = (args, {})
        rec.clock.push(phase)
        self._top_phases.append(phase)
        if phase == "forward" and trained:
            self._training_forward(module, args, _call_kwargs(sys._getframe(1)), rec.clock.frames[-1].running_since)

    def _forward_post(self, module: nn.Module, args: tuple, output: Any) -> None:
        rec = self.probe
        if active.compiling() or not self.discovery or self._depth == 0 or get_ident() != rec.thread:
            return
        self._depth -= 1
        if self._depth != 0 or not self._top_phases:
            return
        phase = self._top_phases.pop()
        seconds = rec.clock.pop()
        if phase == "eval_grad":
            rec.steps.open_step.pending_eval_grad.append((user_site(sys._getframe(1)), seconds))
        self._last_top_phase = phase

    def _direct_forward_owner(self, module: nn.Module) -> nn.Module | None:
        """The trained module holding ``module`` whose ``forward`` the script called directly (``model.forward(x)``,
        so that only its children's calls are seen), when ``module`` is called from inside that forward; else None."""
        frame: FrameType | None = sys._getframe(2)  # the frame above this hook's
        while frame is not None and frame.f_code.co_filename == instrument.MODULE_FILE:  # torch's module-call frames
            frame = frame.f_back
        # Only a method's frame can be a forward's: its locals are read (a dict built) only then.
        found = None
        if frame is not None and "self" in frame.f_code.co_varnames[: frame.f_code.co_argcount]:
            found = frame.f_locals.get("self")
        # A module compiled in place (module.compile()) would run compiled through its call, its own hooks would run
        # (the direct call skips them), and a class's own __call__ (one that calls self.forward) twice: not routed.
        if (
            not isinstance(found, nn.Module)
            or found is module
            or found._compiled_call_impl is not None
            or instrument.hooked(found)
            or _own_call(type(found))
        ):
            return None
        owner: nn.Module = found
        code = self._routed_classes.get(type(owner)) or getattr(getattr(type(owner), "forward", None), "__code__", None)
        while frame is not None and frame.f_code is not code and frame.f_locals.get("self") is owner:
            frame = frame.f_back  # a helper method the forward called
        if frame is None or frame.f_code is not code or not self.is_trained(owner):
            return None
        return owner if any(m is module for m in owner.modules()) else None

    def _route_direct_forward(self, owner: nn.Module) -> None:
        self.top_modules[id(owner)] = weakref.ref(owner)
        cls = type(owner)
        if cls not in self._routed_classes:  # another instance of it may have been routed already
            self._routed_classes[cls] = cls.forward.__code__
            self.patcher.replace(cls, "forward", instrument.direct_forward)

    # -- a training forward ---------------------------------------------------------------------------

    def _training_forward(self, module: nn.Module, args: tuple, kwargs: dict | None, at: float) -> None:
        rec = self.probe
        opened = rec.steps.open_step
        if not opened.marks:
            opened.marks.append((at, rec.clock.timed_so_far()))
        opened.forwards += 1
        self.input_numel[rec.steps.step_index] += _numel(args) + (_numel(tuple(kwargs.values())) if kwargs else 0)
        if rec.gpu and not self._gpu_forward_open:
            rec.gpu_mark("forward", True)
            self._gpu_forward_open = True
        # Facts and a captured batch: first seen at once (a script may end early, or die of an out-of-memory error in
        # its first step), then again in the last warm-up step, under the hooks the measured steps use.
        late = rec.steps.step_index >= rec.schedule.warmup - 1 and not self.discovery
        if self.facts is None or (not self._facts_final and late):
            self._facts_final = late
            self.facts = forward_facts(module, args, kwargs, compiled=self.looked_eagerly)
        if self.want_capture and (self.capture is None or (not self._capture_final and late)):
            self._capture_final = late
            captured = capture_inputs(module, args, kwargs, self.facts, user_site(sys._getframe(2)))
            self.capture = captured or self.capture

    def _note_eval_site(self) -> None:
        tally = self.probe.tallies.tally("eval_forward", user_site(sys._getframe(2)))
        if tally is not None:
            tally.add(self.probe.steps.step_index)


def _call_kwargs(frame: FrameType | None) -> dict[str, Any] | None:
    """The keyword arguments of the module call whose global forward pre-hook runs in ``frame``'s callee: torch hands
    such a hook the positional ones only, and its caller in torch's module code holds the rest
    (``model(x, y, attn_blocksize=...)``: a batch captured without them cannot be run again)."""
    if frame is None or frame.f_code.co_filename != instrument.MODULE_FILE:
        return None
    kwargs = frame.f_locals.get("kwargs")
    return kwargs if isinstance(kwargs, dict) else None


def _own_call(cls: type) -> bool:
    """Whether ``cls`` (a module class) defines ``__call__`` below ``nn.Module``."""
    mro = cls.__mro__
    return any("__call__" in vars(c) for c in mro[: mro.index(nn.Module)]) if nn.Module in mro else False


def _numel(args: tuple) -> int:
    """Elements of the tensors among ``args`` and one level inside their lists, tuples and dicts."""
    total = 0
    for arg in args:
        if isinstance(arg, torch.Tensor):
            total += arg.numel()
        elif isinstance(arg, (list, tuple)):
            total += sum(a.numel() for a in arg if isinstance(a, torch.Tensor))
        elif isinstance(arg, dict):
            total += sum(a.numel() for a in arg.values() if isinstance(a, torch.Tensor))
    return total
