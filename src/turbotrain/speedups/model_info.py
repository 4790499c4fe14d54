"""Structural facts about a model that the registry's rules and the doctor look at."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

__all__ = [
    "ModelInfo",
    "inspect_model",
    "find_conv_bn_pairs",
    "ModelPredicate",
    "ANY_MODEL",
    "CONV_NET",
    "CONV_BN_PAIRS",
    "CONV_NET_SHARE",
]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


@dataclass(frozen=True)
class ModelInfo:
    n_params: int = 0
    n_conv2d: int = 0
    conv_param_share: float = 0.0  # share of parameters in convolutions
    n_batchnorm: int = 0
    n_attention: int = 0  # nn.MultiheadAttention modules
    n_embedding: int = 0
    conv_bn_pairs: tuple[tuple[str, str], ...] = field(default=())

    @property
    def is_conv_net(self) -> bool:
        """The project's one "conv net" test: every rule, tuner filter and doctor rule about convolutions asks it
        (through :data:`CONV_NET`), so a model is never a conv net to one and not to another."""
        # Parameters undercount convolutions' share of the compute (a linear head holds many
        # weights and little work), so a conv net is one with 30% or more of its weights in convs.
        # A lone Conv2d stem in front of a transformer (a ViT's patch embedding) is not one.
        return self.n_conv2d > 0 and self.conv_param_share >= CONV_NET_SHARE


CONV_NET_SHARE = 0.3
"""The least share of a model's weights in convolutions that makes it a conv net (:attr:`ModelInfo.is_conv_net`)."""


@dataclass(frozen=True)
class ModelPredicate:
    """Which models a speed-up is for (``Speedup.applies_to``): Plan.fast recommends it, the tuner times it and its
    doctor rules fire only where ``holds`` is true; ``unmet`` says why not, in the tuner's report."""

    name: str
    holds: Callable[[ModelInfo], bool]
    unmet: str

    def __call__(self, info: ModelInfo) -> bool:
        return self.holds(info)


ANY_MODEL = ModelPredicate("any model", lambda info: True, "")
CONV_NET = ModelPredicate(
    "conv net",
    lambda info: info.is_conv_net,
    f"the model is not a convolutional net (under {CONV_NET_SHARE:.0%} of its weights in 2D convolutions)",
)
CONV_BN_PAIRS = ModelPredicate(
    "conv feeding a BatchNorm", lambda info: bool(info.conv_bn_pairs), "no convolution with a bias feeds a BatchNorm"
)


def find_conv_bn_pairs(model: nn.Module) -> list[tuple[str, str]]:
    """(conv, batchnorm) module names where the conv's output feeds only that BatchNorm.

    Found on the torch.fx graph, so a conv -> relu -> bn chain is never mistaken for a pair.
    A model that fx cannot trace yields no pairs (the rewrite is then skipped, not guessed).
    """
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception:  # noqa: BLE001 - any tracing failure means "unknown", never a crash
        return []
    modules = dict(model.named_modules())
    pairs = []
    for node in graph.nodes:
        if node.op != "call_module" or not isinstance(modules.get(node.target), _CONV):
            continue
        conv = modules[node.target]
        users = list(node.users)
        if conv.bias is None or len(users) != 1:
            continue
        user = users[0]
        if user.op == "call_module" and isinstance(modules.get(user.target), _BN):
            bn = modules[user.target]
            if bn.num_features == conv.out_channels and bn.track_running_stats:
                pairs.append((node.target, user.target))
    return pairs


def inspect_model(model: nn.Module | None) -> ModelInfo:
    if model is None:
        return ModelInfo()
    n_params = conv_params = 0
    n_conv2d = n_bn = n_attn = n_emb = 0
    for module in model.modules():
        own = sum(p.numel() for p in module.parameters(recurse=False))
        n_params += own
        if isinstance(module, _CONV):
            conv_params += own
            n_conv2d += isinstance(module, nn.Conv2d)
        elif isinstance(module, _BN):
            n_bn += 1
        elif isinstance(module, nn.MultiheadAttention):
            n_attn += 1
        elif isinstance(module, nn.Embedding):
            n_emb += 1
    pairs = tuple(find_conv_bn_pairs(model)) if n_bn and conv_params else ()
    return ModelInfo(
        n_params=n_params,
        n_conv2d=n_conv2d,
        conv_param_share=conv_params / n_params if n_params else 0.0,
        n_batchnorm=n_bn,
        n_attention=n_attn,
        n_embedding=n_emb,
        conv_bn_pairs=pairs,
    )
