"""`tensor-created-off-device`: `torch.zeros(...).to(device)` in the loop.

Reads: source.
Applies to: a GPU.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Iterator

from ...analysis.source import dotted_name, keyword
from ...findings import Finding, Fix
from ..common import sources, static_finding
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


FACTORIES = (
    "zeros",
    "ones",
    "empty",
    "full",
    "rand",
    "randn",
    "randint",
    "arange",
    "eye",
    "linspace",
    "tensor",
    "zeros_like",
    "ones_like",
    "rand_like",
    "randn_like",
    "full_like",
)


def created_off_device(ctx: Context) -> Iterator[Finding]:
    for index in sources(ctx):
        for node in ast.walk(index.tree):
            # torch.zeros(...).to(device) / .cuda(): made on the host, then copied.
            if not (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("to", "cuda")
            ):
                continue
            inner = node.func.value
            if not isinstance(inner, ast.Call):
                continue
            name = dotted_name(inner.func)
            if not (name.startswith("torch.") and name.split(".")[-1] in FACTORIES):
                continue
            if keyword(inner, "device") is not None or not index.runs_per_step(node):
                continue
            f = static_finding(
                "tensor-created-off-device",
                index,
                node,
                f"{name}(...) builds the tensor in host memory and then copies it to the device, every step.",
                Fix(f"{name}(..., device=device)"),
            )
            yield f.on_cpu(ctx)


RULE = register(Rule("tensor-created-off-device", detect=(Detect("static", created_off_device),)))
