"""The doctor's rule ids: the names of the rule modules under ``rules/<topic>/``, read from disk without importing
them. The vocabulary's one source of what a rule id is: a finding refuses any other (findings.py), the registry
files each rule under its own (rules/rule.py)."""

from __future__ import annotations

import functools
import pkgutil
from pathlib import Path

__all__ = ["TOPICS", "rule_modules", "rule_ids"]

# The folders of rules/ that hold rule modules, one topic each.
TOPICS = ("data", "step", "loop", "job", "machine", "compile", "memory")


def rule_modules() -> list[str]:
    """``turbotrain.doctor.rules.<topic>.<module>`` for every rule module on disk."""
    rules = Path(__file__).parent / "rules"
    return [
        f"{__package__}.rules.{topic}.{info.name}"
        for topic in TOPICS
        for info in pkgutil.iter_modules([str(rules / topic)])
        if not info.name.startswith("_")
    ]


@functools.cache
def rule_ids() -> tuple[str, ...]:
    """Every rule id (read once: the modules on disk do not change while the doctor runs)."""
    return tuple(sorted(name.rsplit(".", 1)[1].replace("_", "-") for name in rule_modules()))
