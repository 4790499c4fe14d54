"""Where a pipeline cuts the model, and the cut itself: ``torch.distributed.pipelining``'s trace of a
meta copy of the model at the first micro-batch's shape (the trace needs it; a meta copy holds no data).

Split points are module names, each the first module of a stage; by default the largest
``nn.ModuleList`` (a transformer's blocks) cut evenly. A cut that would train silently wrong
(tied weights across stages, a split point forward never reaches) is refused here.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..config import ConfigError

__all__ = ["default_split_points", "check_split_points", "meta_copy", "trace_stages", "stage_of_each_parameter"]


def default_split_points(model: nn.Module, stages: int) -> list[str]:
    """The largest ``nn.ModuleList`` (a transformer's blocks) cut into ``stages`` runs as even as can be."""
    lists = [(len(m), name) for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and name]
    if not lists or max(lists)[0] < stages:
        raise ConfigError(
            f"strategy='pipeline': no split points given, and the model has no nn.ModuleList of at least {stages} "
            "blocks to cut evenly; give Trainer(..., split_points=['name.of.first.module.of.stage.2', ...]) with "
            f"{stages - 1} module names (see model.named_modules())."
        )
    length, name = max(lists)
    return [f"{name}.{(i * length) // stages}" for i in range(1, stages)]


def check_split_points(model: nn.Module, split_points: list[str], stages: int) -> None:
    if len(split_points) != stages - 1:
        raise ConfigError(
            f"split_points: {len(split_points)} given for {stages} stages; give {stages - 1} (each the "
            "first module of the next stage)."
        )
    names = {name for name, _ in model.named_modules()}
    for point in split_points:
        if point not in names or not point:
            near = sorted(n for n in names if n and n.split(".")[0] == point.split(".")[0])[:8]
            raise ConfigError(
                f"split point {point!r} names no module of {type(model).__name__}"
                + (
                    f"; modules nearby: {', '.join(near)}"
                    if near
                    else f"; its top-level modules: {', '.join(n for n in names if n and '.' not in n)}"
                )
            )


def meta_copy(model: nn.Module) -> nn.Module:
    """The same module tree with every parameter and buffer on the meta device (copies no data)."""
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        meta = t.detach().to("meta")
        memo[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(model, memo)


def trace_stages(
    skeleton: nn.Module, example: tuple[torch.Tensor, ...], split_points: list[str], stages: int, training: bool
) -> Any:
    """The traced pipeline of ``skeleton`` (a meta copy) in train or eval mode, cut at ``split_points``."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    skeleton.train(training)
    try:
        pipe = pipeline(skeleton, example, split_spec={p: SplitPoint.BEGINNING for p in split_points})
    finally:
        for point in split_points:  # pipeline() wraps their forward in place: unwrap for the next trace
            module = skeleton.get_submodule(point)
            module.__dict__.pop("forward", None)
            module.__dict__.pop("_orig_forward", None)
    if pipe.num_stages != stages:
        raise ConfigError(
            f"split_points {split_points} cut the traced model into {pipe.num_stages} stages, "
            f"not {stages}: a split point that forward never calls, or calls out of "
            "order, cuts nothing."
        )
    return pipe


def stage_of_each_parameter(pipe: Any) -> dict[str, int]:
    """Parameter name -> the one stage that uses it; tied weights across stages are refused."""
    owner: dict[str, int] = {}
    for i in range(pipe.num_stages):
        for name, _ in pipe.get_stage_module(i).named_parameters():
            if name in owner:
                raise ConfigError(
                    f"parameter {name!r} is used by stages {owner[name]} and {i} (tied weights): each "
                    "stage would update its own copy. Untie it, or put its users in one stage."
                )
            owner[name] = i
    return owner
