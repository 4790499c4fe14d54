"""The speed-up registry: every switch of the Plan, registered once by its own module.

The Trainer (``prepare``), ``Plan.fast()``, the doctor, the tuner and the benchmark all walk
this registry, so a new tip is one module in this package plus its test and bench entry.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..plan import Plan

if TYPE_CHECKING:  # pragma: no cover
    from ..hardware import Hardware
    from ..runtime import Runtime
    from .model_info import ModelInfo

__all__ = ["Speedup", "BenchEntry", "register", "all_speedups", "get", "recommend_plan", "Order"]


class Order:
    """Where in ``prepare`` an entry applies. Model rewrites come before wrapping and compile."""

    GLOBAL = 0          # process-wide backend flags
    MODEL_REWRITE = 10  # exact graph/parameter rewrites on the user's module
    MODEL_DTYPE = 20    # precision (casts for bf16-true, autocast and scaler for mixed)
    MODEL_LAYOUT = 30   # memory format
    MODEL_SYNC = 40     # SyncBatchNorm conversion
    MODEL_WRAP = 50     # DDP / FSDP
    MODEL_COMPILE = 60  # torch.compile always last among model changes
    OPTIMIZER = 70
    LOADER = 80
    STEP = 90


@dataclass(frozen=True)
class BenchEntry:
    """How the benchmark measures an entry: ``changes`` alone on top of the naive plan."""

    workloads: tuple[str, ...]
    changes: dict[str, Any]     # Plan switches to set (the entry's own field, plus any it needs)
    script: str | None = None   # a dedicated benchmark script when the generic ablation cannot show it


def _no_requirement(hw: "Hardware", plan: Plan) -> str | None:
    return None


def _no_recommendation(hw: "Hardware", info: "ModelInfo") -> Any:
    return None


@dataclass(frozen=True)
class Speedup:
    """One tip of the catalogue, as code."""

    name: str
    field: str                                   # the Plan field it switches
    summary: str
    order: int
    apply: Callable[["Runtime"], None]           # mutate the runtime being prepared
    exact: bool                                  # same function, only float rounding may differ
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

    def active(self, plan: Plan) -> bool:
        """Whether ``plan`` asks for this switch (by default: its value differs from the naive plan's)."""
        if self.is_active is not None:
            return self.is_active(plan)
        return getattr(plan, self.field) != getattr(Plan(), self.field)


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


def register(entry: Speedup) -> Speedup:
    """Register ``entry`` once; a second module registering the same name is an error."""
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
        if mod.name not in ("registry", "model_info"):
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


def recommend_plan(model=None, device: str = "auto") -> Plan:
    """``Plan.fast()``: each entry's rule for this hardware and model."""
    from ..hardware import detect
    from .model_info import inspect_model

    hw = detect(device)
    info = inspect_model(model)
    changes: dict[str, Any] = {"device": device}
    for entry in all_speedups():
        value = entry.recommend(hw, info)
        if value is not None:
            changes[entry.field] = value
    plan = Plan(**changes)
    # A rule never recommends what the hardware check would then skip.
    for entry in all_speedups():
        if entry.active(plan) and entry.requires(hw, plan) is not None:
            plan = plan.replace(**{entry.field: getattr(Plan(), entry.field)})
    return plan
