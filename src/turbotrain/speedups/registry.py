"""The speed-up registry: every switch of the Plan, registered once by its own module.

The Trainer (``prepare``), ``Plan.fast()``, the doctor, the tuner, the exports and the benchmark
all walk this registry, so a new tip is one module in this package plus its test. An entry owns
its policy: which models it is for (``applies_to``), how the tuner decides it (``tune``), how it
is exported (``export``) and the doctor rules that answer to it (``doctor_rules``);
:func:`register` refuses an entry that leaves one of them undeclared.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..plan import Plan
from .model_info import ModelPredicate
from .policy import Export, Tuning

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from ..hardware import Hardware
    from ..runtime import Runtime
    from .model_info import ModelInfo

__all__ = [
    "Speedup",
    "BenchEntry",
    "register",
    "all_speedups",
    "get",
    "by_field",
    "recommend_plan",
    "Order",
    "undeclared",
    "DECLARATIONS",
    "UNDECLARED",
]


class Order:
    """Where in ``prepare`` an entry applies. Model rewrites come before wrapping and compile."""

    GLOBAL = 0  # process-wide backend flags
    MODEL_REWRITE = 10  # exact graph/parameter rewrites on the user's module
    MODEL_DTYPE = 20  # precision (casts for bf16-true, autocast and scaler for mixed)
    MODEL_LAYOUT = 30  # memory format
    MODEL_SYNC = 40  # SyncBatchNorm conversion
    MODEL_WRAP = 50  # DDP / FSDP
    MODEL_COMPILE = 60  # torch.compile always last among model changes
    OPTIMIZER = 70
    LOADER = 80
    STEP = 90


@dataclass(frozen=True)
class BenchEntry:
    """How the benchmark measures an entry: ``changes`` alone on top of the naive plan."""

    workloads: tuple[str, ...]
    changes: dict[str, Any]  # Plan switches to set (the entry's own field, plus any it needs)
    script: str | None = None  # a dedicated benchmark script when the generic ablation cannot show it


def _no_requirement(hw: "Hardware", plan: Plan) -> str | None:
    return None


def _no_recommendation(hw: "Hardware", info: "ModelInfo") -> Any:
    return None


class _Undeclared:
    """The default of a declaration every entry must make: :func:`register` refuses an entry that keeps it."""

    def __repr__(self) -> str:
        return "UNDECLARED"


UNDECLARED: Any = _Undeclared()

# The declarations an entry must make, the type each must have, and what to write (the error says it).
DECLARATIONS: dict[str, tuple[type, str]] = {
    "applies_to": (ModelPredicate, "the models it is for: ANY_MODEL, CONV_NET or CONV_BN_PAIRS (speedups.model_info)"),
    "tune": (
        Tuning,
        "how the tuner decides it: timed(...), by_finder(...), by_rule() or not_tuned(why) (speedups.policy)",
    ),
    "export": (
        Export,
        "how it is written for Lightning, Accelerate and plain PyTorch: Export(lightning=..., "
        "accelerate=..., code=..., dataloader=...) or Export(unexported=why) (speedups.policy)",
    ),
}


@dataclass(frozen=True)
class Speedup:
    """One tip of the catalogue, as code."""

    name: str
    field: str  # the Plan field it switches
    summary: str
    order: int
    apply: Callable[["Runtime"], None]  # mutate the runtime being prepared
    exact: bool  # same function, only float rounding may differ
    doctor_rules: tuple[str, ...]
    bench: BenchEntry
    requires: Callable[["Hardware", Plan], str | None] = _no_requirement
    """Why it cannot apply on this hardware (None when it can). Skipped with one log line."""
    recommend: Callable[["Hardware", "ModelInfo"], Any] = _no_recommendation
    """The value ``Plan.fast()`` picks for this hardware and model (None keeps the default)."""
    is_active: Callable[[Plan], bool] | None = None
    """Override of :meth:`active` for switches whose default still does work ('auto')."""
    settings: tuple[str, ...] = ()
    """Other Plan fields that only tune this switch (the pipeline's stages, micro-batches, schedule)."""
    applies_to: ModelPredicate = UNDECLARED
    """The models it is for: Plan.fast recommends it, the tuner times it and its doctor rules fire only there."""
    tune: Tuning = UNDECLARED
    """How ``tt.tune`` decides it (timed and which values, a finder, by rule, or not tuned and why)."""
    export: Export = UNDECLARED
    """How ``tuning/export.py`` writes it: Lightning flags, Accelerate config keys, plain PyTorch lines."""

    def recommendation(self, hw: "Hardware", info: "ModelInfo") -> Any:
        """The value the rule picks for this hardware and model; None where the model is not one it is for."""
        return self.recommend(hw, info) if self.applies_to(info) else None

    def active(self, plan: Plan) -> bool:
        """Whether ``plan`` asks for this switch (by default: its value differs from the naive plan's)."""
        if self.is_active is not None:
            return self.is_active(plan)
        return bool(getattr(plan, self.field) != getattr(Plan(), self.field))


def gpu_only(why: str) -> Callable[["Hardware", Plan], str | None]:
    """A ``requires`` for switches that only mean something on a CUDA device."""
    return lambda hw, plan: None if hw.is_cuda else why


def on_gpu(value: Any = True) -> Callable[["Hardware", "ModelInfo"], Any]:
    """A ``recommend`` rule: ``value`` on a CUDA device, the naive default elsewhere."""
    return lambda hw, info: value if hw.is_cuda else None


def loader_setting(field: str) -> Callable[["Runtime"], None]:
    """An ``apply`` that hands a Plan field to the loader rebuild (workers, pinning, batch size)."""

    def apply(rt: "Runtime") -> None:
        rt.loader_overrides[field] = getattr(rt.plan, field)

    apply.__qualname__ = f"loader_setting({field!r})"
    return apply


_REGISTRY: dict[str, Speedup] = {}
_PLAN_FIELDS = {f.name for f in dataclasses.fields(Plan)}


_OWNERS: dict[str, str] = {}


def undeclared(entry: Speedup) -> list[str]:
    """What ``entry`` leaves undeclared, each with what to write (empty when complete)."""
    missing = []
    for name, (kind, what) in DECLARATIONS.items():
        if not isinstance(getattr(entry, name), kind):
            missing.append(f"{name}: {what}")
    if not entry.doctor_rules:
        missing.append("doctor_rules: the ids of the doctor rules that recommend it (docs/doctor.md)")
    tuning = entry.tune
    if (
        isinstance(tuning, Tuning)
        and tuning.kind == "timed"
        and tuning.values is None
        and not isinstance(getattr(Plan(), entry.field), bool)
    ):
        missing.append(
            f"tune: timed() without values only flips a boolean switch, and Plan.{entry.field} is not "
            "one; pass values=lambda hw, base: (...)"
        )
    return missing


def register(entry: Speedup) -> Speedup:
    """Register ``entry`` once; a second module registering the same name, or an entry that leaves a
    declaration out, is an error."""
    missing = undeclared(entry)
    if missing:
        raise ValueError(f"speed-up {entry.name!r} leaves undeclared: " + "; ".join(missing))
    for name in (entry.field, *entry.settings):
        if name not in _PLAN_FIELDS:
            raise ValueError(f"speed-up {entry.name!r} switches unknown Plan field {name!r}")
    module = sys._getframe(1).f_globals.get("__name__", "?")
    owner = _OWNERS.setdefault(entry.name, module)
    if owner != module:
        raise ValueError(f"speed-up {entry.name!r} registered twice ({owner} and {module})")
    _REGISTRY[entry.name] = entry
    return entry


def _load_all() -> None:
    from .. import speedups as package

    for mod in pkgutil.iter_modules(package.__path__):
        if mod.name not in ("registry", "model_info", "policy"):  # the registry's own parts register nothing
            importlib.import_module(f"{package.__name__}.{mod.name}")


def all_speedups() -> list[Speedup]:
    """Every registered speed-up, in the order ``prepare`` applies them."""
    _load_all()
    return sorted(_REGISTRY.values(), key=lambda s: (s.order, s.name))


def get(name: str) -> Speedup:
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no speed-up named {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def by_field(field: str) -> Speedup:
    for entry in all_speedups():
        if entry.field == field:
            return entry
    raise KeyError(f"no speed-up switches Plan.{field}")


def recommend_plan(model: nn.Module | None = None, device: str = "auto") -> Plan:
    """``Plan.fast()``: each entry's rule for this hardware and model."""
    from ..hardware import detect
    from .model_info import inspect_model

    hw = detect(device)
    info = inspect_model(model)
    changes: dict[str, Any] = {"device": device}
    for entry in all_speedups():
        value = entry.recommendation(hw, info)
        if value is not None:
            changes[entry.field] = value
    plan = Plan(**changes)
    # A rule never recommends what the hardware check would then skip.
    for entry in all_speedups():
        if entry.active(plan) and entry.requires(hw, plan) is not None:
            plan = plan.replace(**{entry.field: getattr(Plan(), entry.field)})
    return plan
