"""`hand-written-layer`: a module of the model computes LayerNorm, RMSNorm, GELU or SiLU by hand (mean, variance,
scale and shift as separate ops; GELU's tanh or erf formula; `x * sigmoid(x)`), where torch has one fused kernel
for it; found by what the module computes, not by its name, and timed on your model with torch's kernel in its place.

Reads: model.
Edit: the class's `forward` returns torch's function of the same input and parameters
(`F.layer_norm(x, self.scale.shape, self.scale, self.shift, self.eps)`, `F.rms_norm(...)`,
`F.gelu(x, approximate="tanh")`, `F.silu(x)`): parameter names, and so checkpoints, unchanged.

Each leaf module class defined in the user's files is run on a copy with random parameters, on inputs at three
scales (so that the epsilon is told apart), against torch's function with the module's own parameters; a class whose
outputs match to float32 precision is named, with the epsilon that matched. The fix is timed on the captured model's
step: each instance's forward swapped for torch's function, interleaved with the step as written.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager, Iterator, Literal

import torch
import torch.nn.functional as F
from torch import nn

from ....measure import judge
from ...analysis.replay import step_two_ways
from ...analysis.source import dotted_name
from ...edits import PRECISION, ByHand, EditSpec
from ...findings import Evidence, Finding, Fix
from ...requests import OwnTrial
from ...results import WhatIf
from ...sites import Site
from ..rule import Detect, Measured, Rule, TimeLeft, register

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...cst_tools import Source
    from ...edits import EditRequest

Kind = Literal["layer_norm", "rms_norm", "gelu", "silu"]
EPSILONS = (1e-5, 1e-6, 1e-8, 1e-12, 1e-4, 1e-3)  # tried after the module's own ``eps``
SCALES = (1.0, 1e-2, 1e-4)  # input scales: at 1e-4 the variance (1e-8) tells 1e-8 from 1e-12 apart
TORCH_MODULE = {"layer_norm": "nn.LayerNorm", "rms_norm": "nn.RMSNorm", "gelu": "nn.GELU", "silu": "nn.SiLU"}
LABEL = {"layer_norm": "LayerNorm", "rms_norm": "RMSNorm", "gelu": "GELU", "silu": "SiLU"}


@dataclass(frozen=True)
class Fused:
    """What a hand-written module computes, as torch's function: its kind, which parameters are the weight and the
    bias, the epsilon (and the attribute holding it), GELU's approximation."""

    kind: Kind
    weight: str | None = None
    bias: str | None = None
    eps: float | None = None
    eps_attr: str | None = None
    approximate: str = "none"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def __call__(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "gelu":
            return F.gelu(x, approximate=self.approximate)
        if self.kind == "silu":
            return F.silu(x)
        weight = getattr(module, self.weight) if self.weight else None
        bias = getattr(module, self.bias) if self.bias else None
        eps = float(getattr(module, self.eps_attr)) if self.eps_attr else self.eps
        assert weight is not None and eps is not None  # a norm is matched with its weight and epsilon
        if self.kind == "layer_norm":
            return F.layer_norm(x, weight.shape, weight, bias, eps)
        return F.rms_norm(x, weight.shape, weight, eps)

    @property
    def shape(self) -> Fused:
        """The same function whatever epsilon each instance holds in its attribute (instances of one class built
        with different ``eps=``)."""
        return dataclasses.replace(self, eps=None) if self.eps_attr else self

    def code(self, torch_functional: str, x: str, me: str = "self") -> str:
        """The call in the user's terms: ``F.layer_norm(x, self.scale.shape, self.scale, self.shift, self.eps)``."""
        if self.kind == "gelu":
            return f'{torch_functional}.gelu({x}, approximate="{self.approximate}")'
        if self.kind == "silu":
            return f"{torch_functional}.silu({x})"
        w = f"{me}.{self.weight}"
        eps = f"{me}.{self.eps_attr}" if self.eps_attr else repr(self.eps)
        if self.kind == "layer_norm":
            bias = f"{me}.{self.bias}" if self.bias else "None"
            return f"{torch_functional}.layer_norm({x}, {w}.shape, {w}, {bias}, {eps})"
        return f"{torch_functional}.rms_norm({x}, {w}.shape, {w}, {eps})"


@dataclass(frozen=True)
class LayerEvidence(Evidence):
    class_name: str
    instances: tuple[str, ...]  # the modules' names in the model
    fused: Fused


@dataclass(frozen=True, kw_only=True)
class LayerResult(WhatIf):
    """The captured model's step as written and with torch's kernels in the hand-written modules, interleaved."""

    kind: ClassVar[str] = "hand_written_layer"
    rounds: tuple[float, ...]
    written_ms: float
    fused_ms: float

    def _fields(self) -> dict[str, Any]:
        return {"rounds": list(self.rounds), "written_ms": self.written_ms, "fused_ms": self.fused_ms}


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to float32 precision, relative to the output's own size (a norm's output is of order one)."""
    if a.shape != b.shape or a.dtype != b.dtype or not torch.isfinite(a).all():
        return False
    scale = float(b.abs().max()) or 1.0
    return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5 * scale))


def _matches(probe: nn.Module, fused: Fused, inputs: list[torch.Tensor]) -> bool:
    try:
        return all(_close(probe(x), fused(probe, x)) for x in inputs)
    except Exception:  # noqa: BLE001 - a module that takes other inputs, or torch's function refusing them: no match
        return False


def identify(module: nn.Module) -> Fused | None:
    """The torch function ``module`` computes (on a copy with random parameters), or None."""
    params = dict(module.named_parameters(recurse=False))
    if len(params) > 2 or any(p.dim() != 1 for p in params.values()) or len({p.numel() for p in params.values()}) > 1:
        return None
    if any(not p.is_floating_point() for p in params.values()):
        return None
    try:
        # In float32 whatever the model's dtype: the question is the formula, and bf16's rounding (or fp16's
        # underflow at the smallest input scale) would hide it.
        probe = copy.deepcopy(module).float()
    except Exception:  # noqa: BLE001 - a module that cannot be copied is left alone, not a failure of the rule
        return None
    dtype = torch.float32
    device = next(iter(params.values())).device if params else torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in probe.parameters(recurse=False):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + 1.0)
    probe.train(module.training)
    if not params:
        x = (torch.randn(4, 8, 16, generator=gen) * 3).to(device, dtype)
        with torch.no_grad():
            elementwise = [Fused("gelu", approximate="tanh"), Fused("gelu"), Fused("silu")]
            return next((g for g in elementwise if _matches(probe, g, [x])), None)
    d = next(iter(params.values())).numel()
    # An offset as large as the spread: LayerNorm subtracts the mean, RMSNorm does not.
    inputs = [((torch.randn(3, 5, d, generator=gen) + 1.0) * s).to(device, dtype) for s in SCALES]
    # The epsilon the module holds, under whatever name (``eps``, ``variance_epsilon``, ...): tried first, and named.
    held = {k: float(v) for k, v in vars(module).items() if isinstance(v, float) and 0 < v < 0.1}
    own_eps = sorted(set(held.values()))
    names = list(params)
    shapes: list[tuple[Kind, str, str | None]]
    if len(names) == 2:  # which is the weight and which the bias: both ways
        shapes = [("layer_norm", names[0], names[1]), ("layer_norm", names[1], names[0])]
    else:
        shapes = [("layer_norm", names[0], None), ("rms_norm", names[0], None)]
    with torch.no_grad():
        for eps in own_eps + [e for e in EPSILONS if not any(math.isclose(e, o) for o in own_eps)]:
            attrs = [k for k, v in held.items() if math.isclose(v, eps)]
            for kind, weight, bias in shapes:
                fused = Fused(kind, weight, bias, eps, attrs[0] if len(attrs) == 1 else None)
                if _matches(probe, fused, inputs):
                    return fused
    return None


def _forward_owner(cls: type, user_files: set[str]) -> tuple[type, str] | None:
    """The class whose own ``forward`` ``cls`` runs and its file, where that forward is the user's (read from its code
    object: a class defined in a script run as ``__main__`` has no importable module to ask)."""
    owner = next((k for k in cls.__mro__ if "forward" in vars(k)), None)
    if owner is None or any(k.__module__.startswith("torch.") and k is not nn.Module for k in owner.__mro__[1:]):
        return None  # a torch layer's subclass (CLIP's LayerNorm upcasts around super().forward): torch's already
    code = getattr(vars(owner).get("forward"), "__code__", None)
    file = os.path.realpath(code.co_filename) if code is not None else ""
    return (owner, file) if file in user_files else None


# torch's own functions and modules for what the rule names: a class that calls one already uses the fused kernel
# (nanoGPT's LayerNorm returns F.layer_norm with an optional bias).
FUSED_CALLS = ("layer_norm", "rms_norm", "gelu", "silu", "LayerNorm", "RMSNorm", "GELU", "SiLU")


def _class_site(ctx: Context, cls: type, file: str) -> Site | None:
    """The ``class`` line of ``cls`` in the user's ``file``; None where that file defines a class of that name more
    than once or the class already calls torch's fused function."""
    for path, index in ctx.sources.items():
        if os.path.realpath(path) != file:
            continue
        found = [n for n in ast.walk(index.tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
        if len(found) != 1:
            return None
        calls = {dotted_name(c.func).rsplit(".", 1)[-1] for c in ast.walk(found[0]) if isinstance(c, ast.Call)}
        return None if calls & set(FUSED_CALLS) else Site(path, found[0].lineno, cls.__name__)
    return None


def _hand_written(ctx: Context) -> Iterator[tuple[type, list[str], Site, Fused]]:
    """Each user class whose ``forward`` computes a torch function in the captured model's leaf modules (its
    subclasses' instances with it), with the instances' names, its ``class`` line and what it computes."""
    capture = ctx.capture
    if capture is None:
        return
    user_files = {os.path.realpath(p) for p in ctx.sources}
    instances: dict[tuple[type, str], dict[type, list[str]]] = {}
    seen: dict[tuple[object, ...], Fused | None] = {}
    for name, module in capture.module.named_modules():
        key = _forward_owner(type(module), user_files) if not any(True for _ in module.children()) else None
        if key is not None:
            instances.setdefault(key, {}).setdefault(type(module), []).append(name)
    for (owner, file), by_class in instances.items():
        site = _class_site(ctx, owner, file)
        # Every instance must compute the same (a constructor flag may switch the formula; a subclass may declare
        # its parameters in another order): one identified per distinct settings.
        names = [n for group in by_class.values() for n in group]
        found = {_identified(capture.module.get_submodule(n), seen) for n in names} if site else set()
        fused = found.pop() if len(found) == 1 else None
        if site is not None and fused is not None:
            yield owner, names, site, fused


def _identified(module: nn.Module, seen: dict[tuple[object, ...], Fused | None]) -> Fused | None:
    """:func:`identify` of ``module`` as a shape (epsilon left to the attribute that holds it), once per class and
    distinct settings (its plain attributes and its parameters' sizes)."""
    settings = tuple(sorted((k, repr(v)) for k, v in vars(module).items() if not k.startswith("_")))
    key = (type(module), settings, tuple((n, p.numel()) for n, p in module.named_parameters(recurse=False)))
    if key not in seen:
        fused = identify(module)
        seen[key] = fused.shape if fused is not None else None
    return seen[key]


def hand_written_layer(ctx: Context) -> Iterator[Finding]:
    for cls, names, site, fused in _hand_written(ctx):
        label = LABEL[fused.kind]
        call = fused.code("F", "x")
        f = Finding(
            "hand-written-layer",
            site=site,
            category="compute",
            message=(
                f"{cls.__name__} computes {label} by hand ({len(names)} in the model): each of its ops is a pass over "
                f"the activations, forward and backward, where torch's {call.split('(')[0]} is one fused kernel "
                "that computes the same (matched on random inputs)."
            ),
            fix=Fix(f"return {call} in {cls.__name__}.forward (or torch.{TORCH_MODULE[fused.kind]})"),
            evidence=LayerEvidence(cls.__name__, tuple(names), fused),
            request=OwnTrial(),
        )
        f.provisional("low")
        f.note = "Changes numerics at float32 rounding (the same formula, fused)."
        yield f


def _fused_in(model: nn.Module, evidence: LayerEvidence) -> Callable[[bool], ContextManager[None]]:
    """``fused_in(True)``: within it, the named instances' forward is torch's function; ``fused_in(False)``: as
    written."""
    modules = [model.get_submodule(name) for name in evidence.instances]
    # A forward set on an instance before (a hook library's wrapper) is put back, not dropped.
    own = {id(m): m.__dict__["forward"] for m in modules if "forward" in m.__dict__}

    @contextlib.contextmanager
    def fused_in(on: bool) -> Iterator[None]:
        if on:
            for m in modules:
                m.forward = lambda x, m=m: evidence.fused(m, x)  # this instance only
        try:
            yield
        finally:
            for m in modules:
                if id(m) in own:
                    m.forward = own[id(m)]
                else:
                    m.__dict__.pop("forward", None)

    return fused_in


def measure(ctx: Context, finding: Finding, budget: TimeLeft) -> Measured | None:
    """The captured model's surrogate step as written against with torch's kernels, in interleaved rounds."""
    if ctx.capture is None:
        return None
    evidence = finding.evidence_as(LayerEvidence)
    timed = step_two_ways(ctx, budget.allows, _fused_in(ctx.capture.module, evidence))
    if timed is None:
        return None
    written_s, fused_s = timed.as_is_s, timed.changed_s
    return Measured(
        what_if=LayerResult(
            rounds=timed.rounds, written_ms=round(written_s * 1e3, 3), fused_ms=round(fused_s * 1e3, 3)
        ),
        verdict=judge(timed.rounds, noise_floor=ctx.noise_floor),
        applies_to=min(1.0, ctx.share("compute") + ctx.share("python_overhead")),
        note=(
            f"Timed on your model's step: {written_s * 1e3:.2f} ms as written, {fused_s * 1e3:.2f} ms with torch's "
            f"kernel in {evidence.class_name}."
        ),
    )


def edit(ctx: Context, f: Finding) -> EditSpec:
    evidence = f.evidence_as(LayerEvidence)
    fused = evidence.fused
    return EditSpec(
        "rule",
        f"{evidence.class_name}.forward as torch's {fused.kind}",
        params={
            "class": evidence.class_name,
            "kind": fused.kind,
            "weight": fused.weight,
            "bias": fused.bias,
            "eps": fused.eps,
            "eps_attr": fused.eps_attr,
            "approximate": fused.approximate,
        },
        numerics=PRECISION,
    )


def rewrite(source: Source, req: EditRequest) -> str:
    """The class's ``forward`` body (after its docstring) as one ``return`` of torch's function."""
    import libcst as cst  # the fix extra, needed by --fix only

    from ...cst_tools import is_docstring, replace

    params = dict(req.params)
    name = params.pop("class")
    classes = [c for c in source.nodes(cst.ClassDef) if c.name.value == name]
    if len(classes) != 1:
        raise ByHand(f"{req.where}: {len(classes)} classes named {name} in {source.name}; edit its forward by hand")
    forwards = [f for f in classes[0].body.body if isinstance(f, cst.FunctionDef) and f.name.value == "forward"]
    if len(forwards) != 1:
        raise ByHand(f"{req.where}: {name} has no forward of its own to edit")
    forward = forwards[0]
    args = forward.params
    if (
        len(args.params) != 2
        or args.star_arg not in (None, cst.MaybeSentinel.DEFAULT)
        or args.kwonly_params
        or args.star_kwarg
    ):
        raise ByHand(f"{req.where}: {name}.forward takes other arguments than one input; edit it by hand")
    torch_functional = source.alias_of("torch.nn.functional") or (
        f"{source.alias_of('torch')}.nn.functional" if source.alias_of("torch") else None
    )
    if torch_functional is None:
        raise ByHand(
            f"{source.name} does not import torch; return torch's {params['kind']} from {name}.forward by hand"
        )
    call = Fused(**params).code(torch_functional, args.params[1].name.value, args.params[0].name.value)
    returned = cst.parse_statement(f"return {call}\n")
    if isinstance(forward.body, cst.IndentedBlock):
        body = list(forward.body.body)
        docstring = body[:1] if body and is_docstring(body[0]) else []
        new_body = forward.body.with_changes(body=[*docstring, returned])
    else:  # ``def forward(self, x): return ...`` on one line: the new body gets a block of its own
        new_body = cst.IndentedBlock(body=[returned])
    return replace(source, {forward: lambda _: forward.with_changes(body=new_body)})


RULE = register(
    Rule(
        "hand-written-layer",
        detect=(Detect("live", hand_written_layer),),
        measure=measure,
        edit=edit,
        rewrite=rewrite,
        quick_trial=True,
    )
)
