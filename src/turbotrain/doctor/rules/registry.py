"""The rule registry: every rule id the doctor knows and the decorator that registers a rule's function.

Its own module so the rule modules (``live``, ``runtime``, ``static``, ``threads``) import it and not the
package that loads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Optional, TypeVar

from ...speedups.registry import all_speedups

if TYPE_CHECKING:
    from ..analysis.context import Context
    from ..findings import Finding

__all__ = ["rule", "RULES", "RULE_IDS", "HABIT_RULES", "RuleFn"]

# Habits in the script that no Plan switch answers (the fix is a change to the user's code).
HABIT_RULES = (
    "host-sync-in-loop",
    "tensor-from-numpy-copy",
    "tensor-created-off-device",
    "dims-not-multiple-of-8",
    "grad-in-validation",
    "empty-cache-in-loop",
    "manual-attention",
    "save-in-loop",
    "slow-storage",
    "periodic-work",
    "straggler",
    "uneven-work",
    "exposed-gradient-sync",
    "ddp-find-unused-parameters",
    "ddp-static-graph",
    "ddp-bucket-settings",
    "per-sample-batch",
    "eval-every-step",
    "unattributed-time",
)

RULE_IDS = tuple(dict.fromkeys(rule_id for entry in all_speedups() for rule_id in entry.doctor_rules)) + HABIT_RULES

# A rule: the findings it sees in a Context (a generator; None where a rule has nothing to say at all).
RuleFn = Callable[["Context"], Optional[Iterable["Finding"]]]
R = TypeVar("R", bound=RuleFn)

RULES: list[tuple[str, str, RuleFn]] = []  # (rule id, source, function)


def rule(rule_id: str, source: str) -> Callable[[R], R]:
    if rule_id not in RULE_IDS:
        raise ValueError(
            f"unknown doctor rule id {rule_id!r}: declare it in its speed-up's doctor_rules "
            "(or, for a habit no Plan switch answers, in HABIT_RULES), and add it to the rule table "
            "in docs/doctor.md"
        )

    def register(fn: R) -> R:
        RULES.append((rule_id, source, fn))
        return fn

    return register
