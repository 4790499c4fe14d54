"""What the trained model's forward looked like, and a copy of one batch of its inputs for what-ifs."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ...data.transfer import batch_size_of, tensors_in
from .recording import Capture
from .measurements import ForwardFacts
from ..sites import Site

__all__ = ["batch_dim", "unbatched", "whole_graph", "forward_facts", "capture_inputs"]

log = logging.getLogger("turbotrain")


# The layers that take ``batch_first`` and default it to False: ``[seq, batch, ...]`` unless told otherwise.
_SEQUENCE_FIRST = (
    nn.RNNBase,
    nn.MultiheadAttention,
    nn.Transformer,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
)


def batch_dim(module: nn.Module, first_input: torch.Tensor | None = None) -> int:
    """Where the batch is in the model's inputs: 1 when its sequence layers (RNNs, attention, transformer
    layers) all take ``[seq, batch, ...]`` (``batch_first=False``, torch's default for each) and the input is a
    sequence (token ids ``[seq, batch]`` or embeddings ``[seq, batch, dim]``, not an image), else 0."""
    layers = [m for m in module.modules() if isinstance(m, _SEQUENCE_FIRST)]
    if not layers or any(getattr(m, "batch_first", False) for m in layers):
        return 0
    return 1 if first_input is None or first_input.dim() in (2, 3) else 0


def unbatched(module: nn.Module, first_input: torch.Tensor | None) -> bool:
    """Whether the input is one sample without a batch dimension, as torch's layers accept it: a 1-D float vector
    of exactly the first Linear's ``in_features`` (a policy fed one environment state), or a ``[C, ...]`` float tensor
    of exactly the first convolution's channels and dimensions. Token ids and other shapes are read as batched."""
    if first_input is None or not first_input.is_floating_point():
        return False
    first = next((m for m in module.modules() if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))), None)
    if isinstance(first, nn.Linear):
        return first_input.dim() == 1 and first_input.shape[0] == first.in_features
    if isinstance(first, nn.modules.conv._ConvNd):
        return first_input.dim() == len(first.kernel_size) + 1 and first_input.shape[0] == first.in_channels
    return False


def whole_graph(inputs: list[torch.Tensor], rows: int | None) -> bool:
    """Whether the ``rows`` of the first input are a graph's nodes, every one of them: another input is an
    ``[N, N]`` adjacency matrix (dense or sparse, pytorch/examples' GCN and GAT) or a ``[2, E]`` edge index of
    integers (PyTorch Geometric's). Its "batch" is then the graph's size, which no batch setting changes."""
    if not rows or len(inputs) < 2:
        return False
    for t in inputs[1:]:
        if t.dim() == 2 and tuple(t.shape) == (rows, rows):
            return True
        if t.dim() == 2 and t.shape[0] == 2 and not t.is_floating_point() and not t.is_complex() and t.numel():
            return True
    return False


def forward_facts(module: nn.Module, args: tuple, kwargs: dict | None, compiled: bool = False) -> ForwardFacts:
    """The facts of a training forward of ``module``; ``compiled``: it runs inside a function the script compiled."""
    param = next(module.parameters(), None)
    device = param.device.type if param is not None else "cpu"
    inputs = tensors_in(list(args) + list((kwargs or {}).values()))
    try:
        autocast = torch.is_autocast_enabled(device)
        autocast_dtype = str(torch.get_autocast_dtype(device)) if autocast else None
    except (TypeError, RuntimeError, AttributeError):
        autocast, autocast_dtype = torch.is_autocast_enabled(), None
    images = [t for t in inputs if t.dim() == 4 and t.is_floating_point()]
    dim = batch_dim(module, inputs[0] if inputs else None)
    single = unbatched(module, inputs[0] if inputs else None)
    rows = 1 if single else int(inputs[0].shape[dim]) if inputs and inputs[0].dim() > dim else None
    return ForwardFacts(
        module_type=type(module).__name__,
        device=device,
        param_dtype=str(param.dtype) if param is not None else "torch.float32",
        autocast=bool(autocast),
        autocast_dtype=autocast_dtype,
        compiled=compiled or type(module).__name__ == "OptimizedModule",
        input_shapes=tuple(tuple(t.shape) for t in inputs[:4]),
        input_channels_last=bool(images)
        and images[0].is_contiguous(memory_format=torch.channels_last)
        and not images[0].is_contiguous(),
        weights_channels_last=any(_channels_last(p) for p in module.parameters()),
        batch_size=rows,
        batch_dim=dim,
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        unbatched=single,
        whole_graph=whole_graph(inputs, rows),
    )


def _channels_last(weight: torch.Tensor) -> bool:
    """A 4-D weight laid out channels_last (a lazy module's weight before its first forward has no layout yet)."""
    return (
        not is_lazy(weight)
        and weight.dim() == 4
        and weight.is_contiguous(memory_format=torch.channels_last)
        and not weight.is_contiguous()
    )


def _keep(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_keep(v) for v in x) if not hasattr(x, "_fields") else type(x)(*[_keep(v) for v in x])
    if isinstance(x, dict):
        return {k: _keep(v) for k, v in x.items()}
    return x


def capture_inputs(
    module: nn.Module, args: tuple, kwargs: dict | None, facts: ForwardFacts | None, site: Site | None
) -> Capture | None:
    """The module and a detached copy of its inputs (None when they cannot be copied: only the what-ifs lose)."""
    dim = facts.batch_dim if facts else 0
    single = bool(facts and facts.unbatched)
    batch_size = (
        facts.batch_size if (dim or single) and facts else batch_size_of(list(args) or list((kwargs or {}).values()))
    )
    if batch_size is None:
        return None  # no input with more than ``dim`` dims: nothing to resize, so no batch the what-ifs can use
    try:
        with torch.no_grad():
            return Capture(
                module=module,
                args=_keep(tuple(args)),
                kwargs=_keep(dict(kwargs or {})),
                batch_size=batch_size,
                site=site,
                batch_dim=dim,
                unbatched=single,
            )
    except Exception as exc:  # noqa: BLE001 - an uncopyable input only costs the what-ifs
        log.info("turbotrain doctor: could not capture the model's inputs: %s", exc)
        return None
