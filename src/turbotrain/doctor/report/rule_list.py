"""``turbotrain doctor --rules``: every registered rule, read from its own module (rules/rule.py's Card), by topic."""

from __future__ import annotations

from typing import IO

from rich.console import Console
from rich.table import Table

from ..rules import all_rules
from ..rules.rule import TOPICS

__all__ = ["print_rules"]


def print_rules(file: IO[str] | None = None, width: int | None = None) -> None:
    """Each rule under its topic: its id, what it reads, where it applies, when it fires and the edit ``--fix``
    writes (``by hand`` where it writes none)."""
    console = Console(file=file, width=width, highlight=False, emoji=False)
    rules = all_rules()
    for topic in TOPICS:
        console.rule(f"[bold]{topic}[/]", align="left")
        for rule in (r for r in rules if r.module.split(".")[-2] == topic):
            card = rule.card
            where = f"; applies to {card.applies_to}" if card.applies_to else ""
            console.print(f"[bold]{rule.id}[/]  [dim]reads {card.reads}{where}[/]")
            fields = Table.grid(padding=(0, 1))
            fields.add_column(no_wrap=True, style="dim", min_width=12)
            fields.add_column()
            fields.add_row("  fires when", card.fires_when)
            fields.add_row("  --fix", card.edit or "by hand")
            console.print(fields)
    console.print(f"{len(rules)} rules, each one module: turbotrain/doctor/rules/<topic>/<rule_id>.py")
