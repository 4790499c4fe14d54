"""The loss a compiled model's output goes into, where that loss runs outside the compiled graph: which of
``torch.nn.functional``'s losses (nn's loss modules call them too), at which line of the script, on what, and the
autograd nodes that ran eagerly between the compiled graph and the loss. The first such call of the run is kept
for the what-if that compiles the loss with the model (rules/compile/compile_loss_eager.py).

A compiled graph's backward is one ``CompiledFunctionBackward`` node (Inductor's and every AOT backend's): a loss
whose input reaches one within a few nodes (a view, a slice, a cast) was computed after the graph, eagerly. A
backend that compiles no graph of its own (``backend="eager"``) has nothing to fuse the loss into: not seen here.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..sites import Site, user_site
from .patcher import Patcher

__all__ = ["LOSSES", "EagerLoss", "LossCapture", "compiled_graph_behind"]

LOSSES = (
    "cross_entropy",
    "nll_loss",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "kl_div",
)
_COMPILED = "CompiledFunctionBackward"
_MAX_NODES = 6  # nodes from the loss's input back to the compiled graph: beyond, the loss is not the graph's


@dataclass(eq=False)
class EagerLoss:
    """One call of a loss on a compiled graph's output, made outside the graph."""

    function: str  # the name in torch.nn.functional: "cross_entropy"
    site: Site | None  # the script's line that called it (directly or through an nn loss module)
    input_shape: tuple[int, ...]  # the loss's input: the compiled output, viewed as the script viewed it
    between: tuple[str, ...]  # the autograd nodes between the compiled graph and that input, nearest first
    call: Callable[..., torch.Tensor]  # torch's own function (not the doctor's wrapper)
    rest: tuple[Any, ...]  # the call's other arguments (the target first), tensors detached
    kwargs: dict[str, Any]


def compiled_graph_behind(tensor: torch.Tensor) -> tuple[str, ...] | None:
    """The autograd nodes between ``tensor`` and the compiled graph that made it (nearest first), following each
    node's first input; None where no compiled graph is that close."""
    node = tensor.grad_fn
    between: list[str] = []
    while node is not None and len(between) <= _MAX_NODES:
        name = type(node).__name__
        if name.startswith(_COMPILED):
            return tuple(between)
        between.append(name)
        node = next((n for n, _ in node.next_functions if n is not None), None)
    return None


def _something_compiled() -> bool:
    """torch.compile made a graph in this process: an eager script's losses cost two lookups, no walk."""
    utils = sys.modules.get("torch._dynamo.utils")
    return utils is not None and utils.counters["stats"]["unique_graphs"] > 0


class LossCapture:
    """Wraps ``torch.nn.functional``'s losses while recording; keeps the first call on a compiled graph's output
    (``found``). Inside a compiled region (torch tracing) the wrapper only calls torch's function."""

    def __init__(self, live: Callable[[], bool]) -> None:
        self.found: EagerLoss | None = None
        self._live = live

    def install(self, patcher: Patcher) -> None:
        for name in LOSSES:
            patcher.replace(F, name, functools.partial(self._wrap, name))

    def _wrap(self, name: str, original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        @functools.wraps(original)
        def loss(*args: Any, **kwargs: Any) -> torch.Tensor:
            # is_compiling first: inside a compiled region torch traces this wrapper, and reading ``found`` there
            # would guard the graph on it (a recompile once a loss is found).
            if not torch.compiler.is_compiling() and self.found is None and _something_compiled() and self._live():
                self._look(name, original, args, kwargs, sys._getframe(1))
            return original(*args, **kwargs)

        return loss

    def _look(self, name: str, original: Callable[..., torch.Tensor], args: tuple, kwargs: dict, frame: Any) -> None:
        if args:
            first, rest, options = args[0], args[1:], dict(kwargs)
        else:
            options = dict(kwargs)
            first, rest = options.pop("input", None), ()
        if not isinstance(first, torch.Tensor) or not first.requires_grad:
            return  # validation under no_grad, or not a model's output
        between = compiled_graph_behind(first)
        if between is None:
            return
        detached = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in rest)
        kept = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in options.items()}
        self.found = EagerLoss(name, user_site(frame), tuple(first.shape), between, original, detached, kept)
