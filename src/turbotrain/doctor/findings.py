"""A finding: one reason the script is slow, where, what to change, and what the change buys.

Severity follows the gain: a finding that would save at least 20% of step time is ``high``,
at least 5% ``medium``, anything less (or unmeasured and unproven on this hardware) ``low``.
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, Union, get_args

from ..plan import Plan
from ..speedups.policy import call_text
from ..speedups.registry import by_field
from .results import WhatIf
from .rule_ids import rule_ids
from .sites import Site, raised_at, source_lines

if TYPE_CHECKING:
    from .requests import WhatIfRequest

__all__ = [
    "Finding",
    "Fix",
    "Evidence",
    "severity_for",
    "speedup_from_share",
    "speedup_for_rule",
    "lightning_call",
    "SEVERITIES",
    "Severity",
    "Category",
    "LateCause",
    "Framework",
    "FindingSource",
    "framework_named",
    "one_line",
    "FRAMEWORK_LABELS",
    "FOLDS",
]


class RunPlace(Protocol):
    """Where the run trained (the analysis context is one)."""

    @property
    def on_gpu(self) -> bool: ...


Severity = Literal["high", "medium", "low"]
SEVERITIES: tuple[Severity, ...] = get_args(Severity)  # most severe first
# The breakdown's categories, in the order the report shows them (record/measurements.py's CATEGORIES): here, in
# the shared vocabulary, because a finding names the one its time is in.
Category = Literal[
    "data_loading", "host_to_device", "compute", "optimizer", "host_sync", "python_overhead", "outside_step"
]
# Why a rank of a multi-process job is late (analysis/ranks.py): the category of its step it spent longer in, a
# slower or shared CPU for the same work ("cpu_contention"), torch.compile compiling again on it where the others
# did not ("recompile"), or none that holds the wait ("unexplained").
LateCause = Union[Category, Literal["cpu_contention", "recompile", "unexplained"]]
# Where a finding came from: the recorded run, the live objects the script built, or its source.
FindingSource = Literal["runtime", "live", "static"]
# Why a low finding cannot matter on the machine and model at hand: the terminal folds such findings into one
# line per reason (the JSON and HTML reports keep them whole). The text counts them: "3 GPU-only habits".
FOLDS = {
    "gpu-only": ("GPU-only habit", "GPU-only habits"),
    "float64": ("float32-only switch (the model is float64)", "float32-only switches (the model is float64)"),
    "fits": (
        "memory fix the step does not need (it fits with room to spare)",
        "memory fixes the step does not need (it fits with room to spare)",
    ),
}
HIGH_SHARE, MEDIUM_SHARE = 0.20, 0.05


ONE_LINE = 160  # characters of an error's first line kept; torch's dispatcher errors list every backend on it


def one_line(exc: BaseException) -> str:
    """An error as one line of a report or a warning: its type and its message's first line, cut after its first
    sentence where the line is long (torch's dispatcher errors run to fifty lines, their first to a thousand
    characters)."""
    lines = str(exc).strip().splitlines()
    if not lines:
        return type(exc).__name__ + _raised_at(exc)
    first, more = lines[0], len(lines) > 1
    if len(first) > ONE_LINE:
        end = first.find(". ")
        first, more = (first[: end + 1] if 0 < end < ONE_LINE else first[: ONE_LINE - 3] + "..."), True
    return f"{type(exc).__name__}: {first}" + (" (...)" if more else "")


def _raised_at(exc: BaseException) -> str:
    """Where an error with no message was raised (a bare ``assert``): the innermost frame of the user's code, else
    the innermost, as `` at train.py:113 (assert g is not None)``; "" where it has no traceback."""
    site = raised_at(exc.__traceback__)
    code: str | None
    if site is not None:
        file, line, code = site.file, site.line, site.code
    else:
        frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ is not None else []
        if not frames:
            return ""
        file, line, code = frames[-1].filename, frames[-1].lineno or 0, frames[-1].line
    return f" at {os.path.basename(file)}:{line}" + (f" ({code})" if code else "")


def severity_for(gain_share: float | None) -> Severity:
    """``high``/``medium``/``low`` for the share of step time a fix saves."""
    if gain_share is None:
        return "low"
    if gain_share >= HIGH_SHARE:
        return "high"
    if gain_share >= MEDIUM_SHARE:
        return "medium"
    return "low"


def speedup_from_share(share: float) -> float:
    """Whole-step speed-up when ``share`` of the step disappears."""
    share = min(max(share, 0.0), 0.95)
    return 1.0 / (1.0 - share)


def speedup_for_rule(rule: str, field: str | None = None) -> str | None:
    """The registry entry (``turbotrain.speedups``) that answers ``rule``, if any."""
    from ..speedups.registry import all_speedups

    matches = [s for s in all_speedups() if rule in s.doctor_rules]
    if field is not None:
        matches = [s for s in matches if s.field == field] or matches
    return matches[0].name if matches else None


def lightning_call(**changes: Any) -> str:
    """``Trainer(benchmark=True)``: the Lightning flags for these Plan switches, as each speed-up's export
    declares them (so a finding's fix and ``tune/export.py`` never say it two ways)."""
    plan = Plan(**changes)
    flags = {k: v for field in changes for k, v in by_field(field).export.lightning_flags(plan).items()}
    return call_text("Trainer", flags)


# The frameworks a fix is said in (the names record/drivers.py gives the loop that ran), and their labels.
Framework = Literal["pytorch", "lightning", "fabric", "accelerate", "hf_trainer"]
FRAMEWORK_LABELS: dict[Framework, str] = {
    "pytorch": "PyTorch",
    "lightning": "Lightning",
    "fabric": "Fabric",
    "accelerate": "Accelerate",
    "hf_trainer": "HF Trainer",
}


def framework_named(name: str | None) -> Framework:
    """The framework a recorded loop's driver name says (record/drivers.py); ``pytorch`` for any other."""
    for framework in FRAMEWORK_LABELS:
        if framework == name:
            return framework
    return "pytorch"


@dataclass(frozen=True)
class Fix:
    """The change, said in the user's own framework.

    ``lightning`` is the Lightning ``Trainer``'s way; a Fabric script gets ``fabric``, an Accelerate loop
    ``accelerate`` and a Hugging Face ``Trainer`` ``hf_trainer`` (``TrainingArguments``), each where it differs
    from the PyTorch line. ``framework`` is the one the script ran with (set with the findings), ``pytorch``
    when unknown.
    """

    pytorch: str
    plan: dict[str, Any] | None = None  # turbotrain Plan switches
    lightning: str | None = None
    accelerate: str | None = None
    fabric: str | None = None
    hf_trainer: str | None = None
    framework: Framework = "pytorch"

    def in_framework(self, name: Framework) -> str | None:
        """The fix for a script written in ``name`` (a key of :data:`FRAMEWORK_LABELS`), if there is one."""
        return {
            "pytorch": self.pytorch,
            "lightning": self.lightning,
            "accelerate": self.accelerate,
            "fabric": self.fabric,
            "hf_trainer": self.hf_trainer,
        }.get(name)

    def text(self, speedup: str | None = None) -> str:
        lines = [f"PyTorch: {self.pytorch}"]
        if self.plan:
            args = ", ".join(f"{k}={v!r}" for k, v in self.plan.items())
            entry = f" (speed-up '{speedup}')" if speedup else ""
            lines.append(f"turbotrain: tt.Plan({args}){entry}")
        for name in ("lightning", "fabric", "accelerate", "hf_trainer"):
            text = self.in_framework(name)
            if text:
                lines.append(f"{FRAMEWORK_LABELS[name]}: {text}")
        return "\n".join(lines)


E = TypeVar("E", bound="Evidence")


@dataclass(frozen=True)
class Evidence:
    """What a rule read or measured for one finding: each rule declares its own frozen subclass, in its module, and
    the fixes, the what-ifs and the tests read its attributes. :meth:`to_dict` is the report's JSON ``evidence`` (a
    stable surface): the fields in their order, one whose default is None left out while it is None, tuples as
    lists, and a nested value (an evidence of its own, a measured row) as its ``to_dict()``."""

    @classmethod
    def read(cls: type[E], record: object) -> E:
        """The evidence whose every field is ``record``'s attribute of that name (a record it shows part of)."""
        return cls(**{f.name: getattr(record, f.name) for f in dataclasses.fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: _json(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if not (f.default is None and getattr(self, f.name) is None)
        }


def _json(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value.to_dict() if hasattr(value, "to_dict") else value


@dataclass
class Finding:
    rule: str
    message: str
    fix: Fix
    severity: Severity = "low"
    site: Site | None = None
    where: str | None = None
    est_speedup: float | None = None
    measured: bool = False
    gain_share: float | None = None  # share of step time the fix would save (drives severity)
    category: LateCause | None = None  # the breakdown category it addresses; on a job, a late rank's cause
    speedup: str | None = None  # registry entry name
    note: str | None = None
    evidence: Evidence | None = None  # its rule's own kind (evidence_as reads it)
    what_if: WhatIf | None = None  # the measured trial behind est_speedup (doctor.results)
    source: FindingSource = "runtime"
    request: "WhatIfRequest | None" = None  # the what-if that can measure this finding's gain (doctor.requests)
    fold: str | None = None  # a key of FOLDS: why it cannot matter here, if it cannot
    ran: bool | None = None  # a static finding's: whether its function ran while the doctor watched (None: unknown)

    def __post_init__(self) -> None:
        if self.rule not in rule_ids():  # the rule modules' names: a mistyped id fails where it is made
            raise ValueError(f"Finding: {self.rule!r} is not a rule id; rule ids: {', '.join(rule_ids())}")

    def evidence_as(self, kind: type[E]) -> E:
        """The evidence, which this finding's rule made a ``kind``."""
        if not isinstance(self.evidence, kind):
            raise TypeError(f"{self.rule}: the evidence is {type(self.evidence).__name__}, not {kind.__name__}")
        return self.evidence

    @property
    def folded(self) -> bool:
        """Left out of the terminal's findings (one line per reason instead): low, and unable to matter here."""
        return self.fold is not None and self.severity == "low"

    def provisional(self, severity: Severity) -> None:
        """A severity before (or without) a measurement; est_speedup stays unknown."""
        self.severity = severity
        self.measured = False

    def on_cpu(self, ctx: RunPlace, what: str = "") -> Finding:
        """Cap a GPU-only finding at ``low`` on a CPU run, saying why it is still reported."""
        if not ctx.on_gpu:
            self.cap(
                "low",
                "This run is on the CPU, where it costs little or nothing; it matters once the "
                f"script runs on a GPU{what}.",
            )
            self.fold = "gpu-only"
        return self

    def set_gain(self, share: float | None, measured: bool) -> None:
        """Record the share of step time this fix saves; severity and est_speedup follow from it."""
        self.gain_share = share
        self.measured = measured
        if share is not None:
            self.est_speedup = round(speedup_from_share(share), 3)
        self.severity = severity_for(share)

    def cap(self, severity: Severity, note: str) -> None:
        """Lower the severity (never raise it) and say why."""
        if SEVERITIES.index(severity) > SEVERITIES.index(self.severity):
            self.severity = severity
        self.note = note if not self.note else f"{self.note} {note}"

    def to_dict(self, base: str | None = None) -> dict[str, Any]:
        where = self.where or (self.site.where(base) if self.site else None)
        out: dict[str, Any] = {
            "rule": self.rule,
            "severity": self.severity,
            "where": where,
            "message": self.message,
            "fix": self.fix.text(self.speedup),
            "est_speedup": self.est_speedup,
            "measured": self.measured,
            "category": self.category,
            "speedup": self.speedup,
            "fixes": {
                "pytorch": self.fix.pytorch,
                "plan": self.fix.plan,
                "lightning": self.fix.lightning,
                "accelerate": self.fix.accelerate,
                "fabric": self.fix.fabric,
                "hf_trainer": self.fix.hf_trainer,
            },
            "source": self.source,
        }
        if self.folded:
            out["folded"] = self.fold
        if self.gain_share is not None:
            out["gain_share"] = round(self.gain_share, 4)
        if self.note:
            out["note"] = self.note
        evidence = self.evidence.to_dict() if self.evidence is not None else {}
        if self.ran is False:
            evidence["ran"] = False  # the static finding's, with its rule's evidence as the JSON has always had it
        if evidence:
            out["evidence"] = evidence
        if self.what_if is not None:
            out["what_if"] = self.what_if.to_dict()
        if self.site is not None:
            out["code"] = [{"line": n, "text": t} for n, t in source_lines(self.site.file, self.site.line)]
        return out
