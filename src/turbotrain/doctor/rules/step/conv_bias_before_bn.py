"""`conv-bias-before-bn`: a conv bias that a BatchNorm cancels (fx graph).

Reads: model.
Edit: `bias=False` in every convolution a BatchNorm follows (each line that built one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from torch import nn

from ...edits import REINITIALISED, ByHand, EditSpec
from ...findings import Evidence, Finding, Fix, speedup_for_rule
from ...requests import PlanRequest
from ...sites import Site
from ..common import for_this_model
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class ConvBnEvidence(Evidence):
    pairs: tuple[tuple[str, str], ...]  # (conv, the BatchNorm after it), by their names in the model


def conv_bias_before_bn(ctx: Context) -> Iterator[Finding]:
    pairs = ctx.info.conv_bn_pairs
    if not for_this_model(ctx, "drop_conv_bias") or ctx.model is None:
        return
    modules = dict(ctx.model.named_modules())
    first = modules.get(pairs[0][0])
    f = Finding(
        "conv-bias-before-bn",
        site=ctx.module_site(first),
        category="compute",
        speedup=speedup_for_rule("conv-bias-before-bn"),
        message=(
            f"{len(pairs)} convolution(s) add a bias right before a BatchNorm, which subtracts the mean and "
            f"so cancels it: wasted adds, gradients and optimizer work ({', '.join(c for c, _ in pairs[:4])}"
            f"{', ...' if len(pairs) > 4 else ''})."
        ),
        fix=Fix("nn.Conv2d(..., bias=False) before each BatchNorm", plan={"drop_conv_bias": True}),
        evidence=ConvBnEvidence(pairs=pairs),
        request=PlanRequest({"drop_conv_bias": True}),
    )
    f.provisional("low")
    yield f


_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def edit(ctx: Context, f: Finding) -> EditSpec:
    """bias=False on every line that builds a conv a BatchNorm follows (and only such convs)."""
    assert f.site is not None  # fixes.choose plans only findings with a site
    modules = dict(ctx.model.named_modules()) if ctx.model is not None else {}
    paired = {name for name, _ in f.evidence_as(ConvBnEvidence).pairs}
    sites: dict[Site, list[str]] = {}
    for name, module in modules.items():
        if isinstance(module, _CONVS):
            site = ctx.module_site(module)
            if site is None:
                raise ByHand(f"where {name} was built is not known; add bias=False to each conv before a BatchNorm")
            sites.setdefault(site, []).append(name)
    lines: list[int] = []
    classes: set[str] = set()
    for site, names in sites.items():
        if not set(names) & paired:
            continue
        unpaired = [n for n in names if n not in paired]
        if unpaired or site.file != f.site.file:
            raise ByHand(
                f"{site.where(ctx.base)} also builds {', '.join(unpaired) or 'convs in another file'}, "
                "which no BatchNorm follows; add bias=False to the right ones by hand"
            )
        lines.append(site.line)
        classes.update(type(modules[n]).__name__ for n in names)
    return EditSpec(
        "conv_bias",
        f"bias=False in {len(paired)} conv(s) before a BatchNorm",
        params={"classes": sorted(classes)},
        lines=tuple(sorted(set(lines) - {f.site.line})),
        numerics=REINITIALISED,
    )


RULE = register(Rule("conv-bias-before-bn", detect=(Detect("live", conv_bias_before_bn),), edit=edit))
