"""What the tuner may try: the registry's switches, filtered by this hardware and this model.

Each registry entry declares how the tuner decides it (``Speedup.tune``, see
:mod:`turbotrain.speedups.policy`) and which models it is for (``Speedup.applies_to``); this
module reads those declarations and keeps no list of switches of its own. The four kinds:

* **timed**: tried on the user's own model in a step trial (precision, compile, layout, ...);
* **finder**: decided by the batch-size or num_workers finder (loader switches);
* **by rule**: exact switches a step trial cannot time (batch copies are made before the
  timed steps), applied where the registry's rule recommends them;
* **not tuned**: switches that are not a per-model speed choice (the launcher picks the
  strategy; SyncBatchNorm changes the statistics), each with the reason shown to the user.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from ..hardware import Hardware
from ..plan import Plan
from ..speedups.model_info import ModelInfo
from ..speedups.registry import Order, Speedup, all_speedups

__all__ = ["Switch", "Candidates", "build_candidates", "finder_fields", "FINDER_FIELDS"]


def finder_fields() -> dict[str, str]:
    """Plan field -> the finder that decides it (the entries declared ``by_finder``)."""
    return {e.field: e.tune.why for e in all_speedups() if e.tune.kind == "finder"}


FINDER_FIELDS = finder_fields()


# Switches whose effect changes once the model is compiled: re-tried under compile.
INTERACTS_WITH_COMPILE = (Order.MODEL_REWRITE, Order.MODEL_DTYPE, Order.MODEL_LAYOUT)


@dataclass(frozen=True)
class Switch:
    """One Plan field and the values worth timing for it, best guess first."""

    name: str  # registry name
    field: str
    values: tuple[Any, ...]
    order: int
    expensive: bool = False  # compiles: tried after the cheap switches, within the budget
    recommended: bool = False  # the registry's rule picks it here: part of the rules' plan the search starts from
    rule_value: Any = None  # the value the rule picks (None: the first of ``values``)

    @property
    def rules_pick(self) -> Any:
        """The value the rules' plan gives this switch (only meaningful when ``recommended``)."""
        return self.rule_value if self.rule_value in self.values else self.values[0]

    @property
    def interacts_with_compile(self) -> bool:
        return self.order in INTERACTS_WITH_COMPILE


@dataclass
class Candidates:
    timed: list[Switch] = field(default_factory=list)
    by_rule: dict[str, Any] = field(default_factory=dict)  # field -> value
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (name, why), shown in the report


def _values(entry: Speedup, hw: Hardware, info: ModelInfo, base: Plan) -> tuple[tuple[Any, ...], str | None]:
    """The values to time for ``entry`` (empty with a reason when there is nothing to try)."""
    if not entry.applies_to(info):
        return (), entry.applies_to.unmet
    tuning = entry.tune
    if tuning.values is None:  # registration made sure the field is a boolean: try the other value
        return (not getattr(Plan(), entry.field),), None
    values = tuple(tuning.values(hw, base))
    if not values:
        return (), tuning.nothing_to_try.format(hw=hw) or f"no values to try for Plan.{entry.field}"
    return values, None


def build_candidates(
    hw: Hardware, info: ModelInfo, base: Plan, include: Iterable[str] | None = None, exclude: Iterable[str] = ()
) -> Candidates:
    """Walk the registry: each entry becomes a timed switch, a rule, or a reason it is left out.

    ``include``/``exclude`` take registry names (``"compile"``, ``"precision"``, ...).
    """
    include = set(include) if include is not None else None
    exclude = set(exclude)
    known = {entry.name for entry in all_speedups()}
    unknown = ((include or set()) | exclude) - known
    if unknown:
        raise ValueError(f"tune: unknown speed-up name(s) {sorted(unknown)}; known: {', '.join(sorted(known))}")
    out = Candidates()
    for entry in all_speedups():
        kind = entry.tune.kind
        if kind == "finder":
            continue  # reported by the finders themselves
        if entry.name in exclude or (include is not None and entry.name not in include):
            out.left_out.append((entry.name, "excluded by the caller"))
            continue
        if kind == "not_tuned":
            out.left_out.append((entry.name, entry.tune.why))
            continue
        if kind == "by_rule":
            value = entry.recommendation(hw, info)
            reason = entry.requires(hw, base.replace(**{entry.field: value if value is not None else True}))
            if value is not None and reason is None:
                out.by_rule[entry.field] = value
            else:
                out.left_out.append((entry.name, reason or "its rule does not recommend it here"))
            continue
        values, why = _values(entry, hw, info, base)
        # The registry's own hardware check, asked value by value (fp16 needs CUDA, TF32 Ampere, ...).
        allowed = []
        for value in values:
            reason = entry.requires(hw, base.replace(**{entry.field: value}))
            if reason is None:
                allowed.append(value)
            else:
                why = reason
        if allowed:
            rule = entry.recommendation(hw, info)
            recommended = rule not in (None, getattr(Plan(), entry.field)) and rule in allowed
            out.timed.append(
                Switch(
                    entry.name,
                    entry.field,
                    tuple(allowed),
                    entry.order,
                    expensive=entry.tune.expensive,
                    recommended=recommended,
                    rule_value=rule if recommended else None,
                )
            )
        else:
            out.left_out.append((entry.name, why or "not supported here"))
    return out
