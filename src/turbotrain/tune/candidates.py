"""What the tuner may try: the registry's switches, filtered by this hardware and this model.

Every registry entry ends up in exactly one of four groups, and a test fails when a new
entry is in none, so adding a speed-up forces a decision here:

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
from ..speedups.cpu_threads import thread_values
from ..speedups.model_info import ModelInfo
from ..speedups.registry import Order, Speedup, all_speedups

__all__ = ["Switch", "Candidates", "build_candidates", "FINDER_FIELDS", "BY_RULE_FIELDS", "NOT_TUNED"]

# Plan fields the finders own (see batch_size.py and workers.py).
FINDER_FIELDS = {
    "batch_size": "batch-size finder",
    "grad_accum_steps": "batch-size finder (keeps the effective batch when asked)",
    "num_workers": "num_workers finder",
    "persistent_workers": "num_workers finder (on with workers)",
    "pin_memory": "num_workers finder (on for a GPU)",
}

# Exact switches that only act on the host-to-device copy, which a step trial makes once,
# before the timed steps: they cannot be timed there, and the registry's rule applies them.
BY_RULE_FIELDS = {"non_blocking", "device_prefetch"}

NOT_TUNED = {
    "strategy": "decided by how the job is launched (one process or torchrun), not per model: DDP, FSDP and a "
                "pipeline need several processes, so one device never gets them",
    "sync_batchnorm": "changes batch statistics across processes (accuracy, not speed)",
    "set_to_none": "the naive plan already drops gradients (torch's default)",
}

# Switches whose effect changes once the model is compiled: re-tried under compile.
INTERACTS_WITH_COMPILE = (Order.MODEL_REWRITE, Order.MODEL_DTYPE, Order.MODEL_LAYOUT)

_CONV_ONLY = {"channels_last", "cudnn_benchmark"}
# bf16-true trains bf16 *weights*: small updates round away over a long run, which a trial
# of a few steps cannot show, so it is a memory choice the user makes, not one we measure.
_PRECISIONS = ("bf16-mixed", "fp16-mixed")
_CUDA_COMPILE_MODES = ("max-autotune-no-cudagraphs", "reduce-overhead")


@dataclass(frozen=True)
class Switch:
    """One Plan field and the values worth timing for it, best guess first."""

    name: str                  # registry name
    field: str
    values: tuple[Any, ...]
    order: int
    expensive: bool = False    # compiles: tried after the cheap switches, within the budget
    recommended: bool = False  # the registry's rule picks it here: timed first, while the budget is fresh

    @property
    def interacts_with_compile(self) -> bool:
        return self.order in INTERACTS_WITH_COMPILE


@dataclass
class Candidates:
    timed: list[Switch] = field(default_factory=list)
    by_rule: dict[str, Any] = field(default_factory=dict)          # field -> value
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (name, why), shown in the report


def _values(entry: Speedup, hw: Hardware, info: ModelInfo, base: Plan) -> tuple[tuple[Any, ...], str | None]:
    """The values to time for ``entry`` (empty with a reason when there is nothing to try)."""
    name = entry.name
    if entry.field == "intra_op_threads":  # the usable cores, half, one: whichever torch does not use now
        current = base.intra_op_threads or hw.intra_op_threads
        return thread_values(hw.usable_cores, current), f"torch already runs 1 thread on {hw.usable_cores} usable core"
    if name in _CONV_ONLY and not info.n_conv2d:
        return (), "the model has no 2D convolutions"
    if name == "drop_conv_bias" and not info.conv_bn_pairs:
        return (), "no convolution with a bias feeds a BatchNorm"
    if entry.field == "precision":
        return _PRECISIONS, None
    if entry.field == "compile":
        return ((True, *_CUDA_COMPILE_MODES) if hw.is_cuda else (True,)), None
    default = getattr(Plan(), entry.field)
    if isinstance(default, bool):
        return (not default,), None
    return (), f"no values to try for Plan.{entry.field}"


def build_candidates(hw: Hardware, info: ModelInfo, base: Plan, include: Iterable[str] | None = None,
                     exclude: Iterable[str] = ()) -> Candidates:
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
        if entry.field in FINDER_FIELDS:
            continue  # reported by the finders themselves
        if entry.name in exclude or (include is not None and entry.name not in include):
            out.left_out.append((entry.name, "excluded by the caller"))
            continue
        if entry.field in NOT_TUNED:
            out.left_out.append((entry.name, NOT_TUNED[entry.field]))
            continue
        if entry.field in BY_RULE_FIELDS:
            value = entry.recommend(hw, info)
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
            out.timed.append(Switch(entry.name, entry.field, tuple(allowed), entry.order,
                                    expensive=entry.field == "compile",
                                    recommended=entry.recommend(hw, info) not in (None, getattr(Plan(), entry.field))))
        else:
            out.left_out.append((entry.name, why or "not supported here"))
    return out
