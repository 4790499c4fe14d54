"""A rule, and the registry of rules: one module per rule, ``rules/<topic>/<rule_id>.py``.

A rule module ends with ``RULE = register(Rule(...))``: its id (the module's name, ``-`` for ``_``), how it
detects (one :class:`Detect` per source it reads: the recorded run, the live objects, the script's source),
where it times its own fix, how (:data:`Measurer`: a finding asks for it with ``request=OwnTrial()``, and the
rule returns a :class:`Measured` that the what-if stage attaches; the rule never edits the finding) and, where
its fix is an edit of the user's code, how that edit is planned (:data:`EditPlanner`, a typed
:class:`~turbotrain.doctor.edits.EditSpec`). Which speed-up answers it is read from the speed-up registry
(``Speedup.doctor_rules``); a rule no speed-up declares is a habit of the script's own. :func:`register` refuses a
rule that leaves a declared part out or lives in a module not named after it, as ``speedups/`` does.
"""

from __future__ import annotations

import importlib
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Literal, Optional, Protocol, get_args

from ...speedups.registry import all_speedups
from ..rule_ids import TOPICS, rule_ids, rule_modules

if TYPE_CHECKING:
    from ...measure import Comparison
    from ..analysis.context import Context
    from ..cst_tools import Source as ParsedSource
    from ..edits import EditRequest, EditSpec
    from ..findings import Finding, Fix
    from ..results import WhatIf

__all__ = [
    "Rule",
    "Card",
    "parse_card",
    "Detect",
    "Measured",
    "TimeLeft",
    "Source",
    "SOURCES",
    "register",
    "all_rules",
    "by_id",
    "rule_ids",
    "habit_rules",
    "TOPICS",
]

# What a detector reads: the recorded run, the live objects the script built, or the script's source.
Source = Literal["runtime", "live", "static"]
SOURCES: tuple[Source, ...] = get_args(Source)

# A detector: the findings it sees in a Context (a generator; None where it has nothing to say at all).
Detector = Callable[["Context"], Optional[Iterable["Finding"]]]
# An edit planner: the edit that fixes one of the rule's findings; raises fixes.model.ByHand when it cannot.
EditPlanner = Callable[["Context", "Finding"], "EditSpec"]
# A rule's own rewrite, for its EditSpec of kind "rule": the parsed file and the request to the file's new text
# (raises fixes.model.ByHand when it cannot be made safely).
Rewriter = Callable[["ParsedSource", "EditRequest"], str]


class TimeLeft(Protocol):
    """The what-ifs' budget as a rule's measurer sees it (:class:`..whatif.common.Budget`)."""

    @property
    def left(self) -> float: ...

    def allows(self, cost_s: float) -> bool: ...


@dataclass(frozen=True)
class Measured:
    """What a rule's own trial measured, for the what-if stage to attach to the finding: the result to show, the
    judged ratio (:func:`turbotrain.measure.judge`) and the share of the step that ratio applies to; ``fix``, the
    fix said again with what was measured (the best setting found), and ``note``, one line on how it was timed."""

    what_if: WhatIf
    verdict: Comparison
    applies_to: float
    fix: Fix | None = None
    note: str | None = None
    unit: str = "model's step time"  # what the ratio is of (a whole run's time, compiling included)
    low: bool = False  # rated low whatever the ratio: a faster step whose compiling the run is too short to win back


# A measurer: times one of the rule's findings within the budget; None when it cannot (no model, no time).
Measurer = Callable[["Context", "Finding", TimeLeft], Optional[Measured]]

_ID = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_FIELD = re.compile(r"^(Reads|Applies to|Edit): ", re.MULTILINE)


@dataclass(frozen=True)
class Card:
    """What a rule module's docstring says of its rule, for ``turbotrain doctor --rules`` and the docs.

    The docstring opens with ``"`rule-id`: when it fires."``, then one paragraph of fields, each starting a line:
    ``Reads:`` (what it reads: run, source, model, every rank's run, ...), optionally ``Applies to:`` (where it
    matters: a GPU, a multi-process job) and, for a rule ``--fix`` can write, ``Edit:`` (the edit it writes). What
    follows is for maintainers."""

    fires_when: str
    reads: str
    applies_to: str | None = None
    edit: str | None = None


def parse_card(doc: str, rule_id: str) -> Card:
    """The :class:`Card` in a rule module's docstring; a ValueError saying what is missing."""
    paragraphs = re.split(r"\n\s*\n", doc.strip())
    head = " ".join(paragraphs[0].split())
    opening = f"`{rule_id}`: "
    if not head.startswith(opening) or len(head) <= len(opening) + 10:
        raise ValueError(f"its docstring does not open with {opening!r} and when the rule fires")
    parts = _FIELD.split(paragraphs[1]) if len(paragraphs) > 1 else [""]
    if parts[0].strip():
        raise ValueError("the docstring's second paragraph is not its fields (Reads:, Applies to:, Edit:)")
    fields = {key: " ".join(value.split()).rstrip(".") for key, value in zip(parts[1::2], parts[2::2])}
    if not fields.get("Reads"):
        raise ValueError("its docstring says nothing after 'Reads:' (what the rule reads)")
    return Card(head[len(opening) :], fields["Reads"], fields.get("Applies to"), fields.get("Edit"))


@dataclass(frozen=True)
class Detect:
    """One way a rule detects: from ``source``, with ``fn``."""

    source: Source
    fn: Detector


@dataclass(frozen=True)
class Rule:
    """One doctor rule: its id, its detectors and, for a fix that is an edit, its edit planner.

    ``measure``: times a finding that asks for it (``request=OwnTrial()``); ``quick_trial``: before the plan's
    trials. ``edits_without_site``: the edit goes where the rule says, not at the finding's line (a process-wide
    flag such as ``cudnn.benchmark`` after the imports), so a finding without a line can still be fixed.
    ``rewrite``: the edit itself, where no edit kind of ``fixes/`` makes it: the planner then returns an
    ``EditSpec("rule", ...)``.
    """

    id: str
    detect: tuple[Detect, ...]
    measure: Measurer | None = None
    edit: EditPlanner | None = None
    edits_without_site: bool = False
    rewrite: Rewriter | None = None
    # Its measurer costs a few of the captured model's steps: timed before the plan's trials (fresh processes, tens
    # of seconds), so that the default budget reaches it; the other rules' own trials come last.
    quick_trial: bool = False

    @property
    def module(self) -> str:
        return self.detect[0].fn.__module__ if self.detect else ""

    @property
    def speedups(self) -> tuple[str, ...]:
        """The speed-up registry's entries that answer this rule (none for a habit of the script)."""
        return tuple(s.name for s in all_speedups() if self.id in s.doctor_rules)

    @property
    def card(self) -> Card:
        """What the rule module's docstring says: when it fires, what it reads, where it applies, its edit."""
        return parse_card(_module_doc(self.module), self.id)


def _module_doc(module: str) -> str:
    # A rule registers at the end of its own module, before the import finished: read it from sys.modules.
    found = sys.modules.get(module) or importlib.import_module(module)
    return found.__doc__ or ""


_RULES: dict[str, Rule] = {}


def _refusals(rule: Rule) -> list[str]:
    wrong = []
    if not _ID.match(rule.id):
        wrong.append(f"its id {rule.id!r} is not lower-case words joined by '-'")
    if not rule.detect:
        wrong.append("detect: no Detect(source, function) given")
    for d in rule.detect:
        if d.source not in SOURCES:
            wrong.append(f"detect: source {d.source!r} is not one of {', '.join(SOURCES)}")
    modules = {d.fn.__module__ for d in rule.detect} | {f.__module__ for f in (rule.measure, rule.rewrite) if f}
    if rule.edit is not None and rule.edit.__module__ != f"{__package__}.common":  # shared planners live there
        modules.add(rule.edit.__module__)
    if len(modules) > 1:
        wrong.append(f"its detectors and edit come from {len(modules)} modules ({', '.join(sorted(modules))}): one")
    module = rule.module.rsplit(".", 2)
    if len(module) < 3 or module[-2] not in TOPICS or module[-1] != rule.id.replace("-", "_"):
        wrong.append(
            f"it lives in {rule.module}; a rule lives in turbotrain.doctor.rules.<topic>.{rule.id.replace('-', '_')} "
            f"(topics: {', '.join(TOPICS)})"
        )
    if rule.detect:
        try:
            card = rule.card
        except ValueError as exc:
            wrong.append(str(exc))
        else:
            if (card.edit is None) != (rule.edit is None):
                said = "says no 'Edit:'" if card.edit is None else "has an 'Edit:'"
                wrong.append(f"it {'has' if rule.edit else 'has no'} edit but its docstring {said}")
    if rule.edits_without_site and rule.edit is None:
        wrong.append("edits_without_site is set but it has no edit")
    if rule.rewrite is not None and rule.edit is None:
        wrong.append("rewrite is set but it has no edit to plan it")
    if rule.id in _RULES and _RULES[rule.id] is not rule:
        wrong.append(f"{rule.id!r} is registered already, by {_RULES[rule.id].module}")
    return wrong


def register(rule: Rule) -> Rule:
    """Add ``rule`` to the registry; a ValueError naming each missing or wrong part if it is incomplete."""
    wrong = _refusals(rule)
    if wrong:
        raise ValueError(f"doctor rule {rule.id!r} is incomplete: " + "; ".join(wrong))
    _RULES[rule.id] = rule
    return rule


def habit_rules() -> tuple[str, ...]:
    """The rules no Plan switch answers: the fix is a change to the user's code."""
    declared = {rule_id for entry in all_speedups() for rule_id in entry.doctor_rules}
    return tuple(r for r in rule_ids() if r not in declared)


def all_rules() -> tuple[Rule, ...]:
    """Every rule, its module imported (which registers it); a module that registers no RULE is an error."""
    for name in rule_modules():
        module = importlib.import_module(name)
        registered = getattr(module, "RULE", None)
        if not isinstance(registered, Rule) or _RULES.get(registered.id) is not registered:
            raise ValueError(
                f"{name} defines no RULE = register(Rule(...)): every module under rules/<topic>/ is a rule"
            )
    return tuple(_RULES[r] for r in sorted(_RULES))


def by_id(rule_id: str) -> Rule:
    """The rule ``rule_id``; a KeyError naming the known ones if there is none."""
    rules = {r.id: r for r in all_rules()}
    try:
        return rules[rule_id]
    except KeyError:
        raise KeyError(f"no doctor rule {rule_id!r}; known: {', '.join(sorted(rules))}") from None
