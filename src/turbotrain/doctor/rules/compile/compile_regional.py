"""`compile-regional`: a compiled model of 3+ identical blocks (a `ModuleList`/`Sequential` holding most parameters)
compiled whole with 0.25 s or more of first compiles: compiling each block instead (regional compilation) timed,
fresh compiles of both, their first-call seconds and the step.

Reads: run + model.

torch.compile of the whole model traces every block into one graph, so its compile time grows with the depth;
compiling the block class instead (``block.compile()`` on each, PyTorch's "regional compilation") traces one block
and reuses its code for the others. Timed on the captured batch: the model compiled whole, as the script compiles
it, against each block compiled, fresh compiles of both; the compile seconds of each are their first calls, the step
is interleaved. The verdict is the step's: compile time is said, never counted as a per-step gain.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch

from ...findings import Evidence, Finding, Fix
from ...requests import OwnTrial
from ..rule import Detect, Measured, Rule, TimeLeft, register
from ._common import (
    PairTiming,
    Variant,
    compile_site,
    compile_seconds,
    compiled_model,
    recompiled,
    regionally_compiled,
    seconds_text,
    measured_pair,
    torch_builtin,
    submodule_path,
    pair_text,
    user_codes,
)

if TYPE_CHECKING:
    from ...analysis.context import Context

# Blocks worth compiling one by one: at least this many of one class in one container, holding at least this share
# of the model's parameters; and a whole-model compile that took at least this long.
MIN_BLOCKS = 3
MIN_PARAMETER_SHARE = 0.5
MIN_COMPILE_S = 0.25


@dataclass(frozen=True)
class RegionalEvidence(Evidence):
    container: str  # the blocks' ModuleList or Sequential, by its name in the model ("": the model itself)
    block: str  # their class's name
    blocks: int
    first_compile_s: float


def repeated_blocks(model: torch.nn.Module) -> tuple[str, str, int] | None:
    """The shallowest ``ModuleList``/``Sequential`` whose children are ``MIN_BLOCKS`` or more of one class holding
    most of the parameters: (its name in the model, the class's name, how many)."""
    total = sum(p.numel() for p in model.parameters())
    if not total:
        return None
    for name, module in model.named_modules():
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        children = list(module.children())
        counts = Counter(type(c) for c in children)
        if not counts:
            continue
        cls, count = counts.most_common(1)[0]
        held = sum(p.numel() for c in children if type(c) is cls for p in c.parameters())
        if count >= MIN_BLOCKS and count == len(children) and held >= MIN_PARAMETER_SHARE * total:
            return name, cls.__name__, count
    return None


def regional(ctx: Context) -> Iterator[Finding]:
    model = compiled_model(ctx)
    if model is None or not user_codes(ctx):
        return
    original = model._orig_mod
    assert isinstance(original, torch.nn.Module)  # compiled_model checked it
    found = repeated_blocks(original)
    first, _ = compile_seconds(ctx)
    if found is None or first < MIN_COMPILE_S:
        return
    container, cls, count = found
    where = "model" + submodule_path(container)
    builtin = torch_builtin(type(next(original.get_submodule(container).children())))
    # torch's own block classes are skipped by Dynamo: block.compile() on one compiles nothing, torch.compile traces it.
    each = "{blocks}[i] = torch.compile(block)" if builtin else "block.compile()"
    loop = "for i, block in enumerate({blocks}):" if builtin else "for block in {blocks}:"
    text = (
        f"Compile each {cls} instead of the whole model: `{loop.format(blocks=where)} {each.format(blocks=where)}` in "
        f"place of torch.compile(model); torch compiles the block's code once and reuses it for all {count}"
        + (f" (`block.compile()` on torch's own {cls} compiles nothing: Dynamo skips its code)" if builtin else "")
    )
    lightning = "self" + submodule_path(container)
    site = compile_site(ctx)  # the fix replaces the script's torch.compile call: there, when there is one
    f = Finding(
        "compile-regional",
        site=site,
        category="python_overhead",
        message=(
            f"torch.compile traced the whole model, {count} {cls} blocks ({container or 'the model itself'}) "
            f"inlined into one graph: {seconds_text(first)} of first compiles, growing with the depth."
        ),
        fix=Fix(
            text,
            lightning=f"In configure_model: `{loop.format(blocks=lightning)} {each.format(blocks=lightning)}` (not the "
            "whole module)",
            hf_trainer=f"Compile each {cls} yourself before Trainer(...) instead of torch_compile=True",
        ),
        evidence=RegionalEvidence(container=container, block=cls, blocks=count, first_compile_s=round(first, 3)),
        request=OwnTrial(),
    )
    f.provisional("low")
    f.note = "Unmeasured: the what-ifs compile both ways and time the step."
    yield f


def measure(ctx: Context, f: Finding, budget: TimeLeft) -> Measured | None:
    """The model compiled whole (fresh, as the script compiles it) against each block compiled, interleaved."""
    model = compiled_model(ctx)
    if model is None:
        return None
    first, again = compile_seconds(ctx)
    evidence = f.evidence_as(RegionalEvidence)
    whole = Variant("the model compiled whole", recompiled(model))
    blocks = Variant(
        f"each of the {evidence.blocks} {evidence.block} compiled", regionally_compiled(model, evidence.container)
    )

    def say(timing: PairTiming, _steps_differ: bool) -> str:
        return pair_text(timing, "whole", "block by block", "compile block by block")

    return measured_pair(ctx, budget, whole, blocks, say, first, first + again)


RULE = register(Rule("compile-regional", detect=(Detect("runtime", regional),), measure=measure))
