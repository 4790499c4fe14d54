"""How one doctor run measures, what it times and what it writes: ``DoctorOptions``, in the Plan's idiom.

Each field has its docstring and, where the command offers it, its flag (``field(metadata=flag(...))``):
``turbotrain doctor``'s options are built from these fields (:func:`add_option_arguments`), so a default
or a check is written once, and ``tt.doctor.watch()`` and the Python API are checked as the command is.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from ..config import ConfigError, field_docs, parse_size, strict

__all__ = ["DoctorOptions", "add_option_arguments", "options_from_args"]


def flag(name: str, metavar: str | None = None) -> dict[str, Any]:
    """A field's command-line flag (a bool that defaults to True takes a ``--no-...`` flag)."""
    return {"flag": name, "metavar": metavar}


@strict
@dataclass(frozen=True)
class DoctorOptions:
    """What a doctor run does. ``DoctorOptions()`` is what ``turbotrain doctor script.py`` runs."""

    steps: int = field(default=20, metadata=flag("--steps", "N"))
    """Steps to measure: optimizer steps, or backward passes when no optimizer steps."""
    record_budget_s: float = field(default=180.0, metadata=flag("--record-budget", "SECONDS"))
    """Where --steps steps would take longer than this, measure the steps that fit in it (at least 5; one
    profiled); 0: always --steps."""
    warmup: int = field(default=3, metadata=flag("--warmup", "N"))
    """Steps before measuring (compile, caches, the outermost module found); at least 1: the first step holds
    the script's set-up."""
    profile_steps: int = 2
    """Steps under torch.profiler after the measured ones (the op table and the trace)."""
    what_if: bool = field(default=True, metadata=flag("--no-what-if"))
    """Measure the fixes on the captured model and loader; --no-what-if: estimates only (faster)."""
    what_if_budget_s: float | None = field(default=None, metadata=flag("--what-if-budget", "SECONDS"))
    """Seconds allowed for measuring fixes (default: 20, or 60 of the script's steps where they are long, at
    most 180)."""
    compile: bool = field(default=False, metadata=flag("--compile"))
    """Also measure torch.compile (compiling takes a while)."""
    watch_s: float = field(default=20.0, metadata=flag("--watch", "SECONDS"))
    """After the window, watch the step clock this long at most for work the loop runs every N steps beyond it
    (evaluation, checkpoints); 0: end with the window."""
    trace_path: str | None = field(default=None, metadata=flag("--trace", "PATH"))
    """Write a Chrome/Perfetto trace of the profiled steps here (open it in ui.perfetto.dev)."""
    fix: str | None = field(default=None, metadata=flag("--fix", "PATH"))
    """Write each finding's fix as one unified diff of the script here (git apply PATH)."""
    verify: bool = field(default=False, metadata=flag("--verify"))
    """Run the original and the patched script interleaved: the verified speed-up and losses."""
    verify_budget_s: float = field(default=120.0, metadata=flag("--verify-budget", "SECONDS"))
    """Seconds for verifying fixes one at a time; all of them together always runs."""
    verify_rounds: int = field(default=2, metadata=flag("--verify-rounds", "N"))
    """Interleaved original/patched rounds per comparison."""
    fix_rules: tuple[str, ...] | None = field(default=None, metadata=flag("--fix-only", "RULES"))
    """Comma-separated rule ids: patch only their findings (default: every fixable one)."""
    hang_timeout_s: float = field(default=120.0, metadata=flag("--rank-timeout", "SECONDS"))
    """On several processes: end the job when no rank makes progress for this long."""
    memory_limit_bytes: int | None = field(default=None, metadata=flag("--memory-limit", "SIZE"))
    """Run as if the device had only this much memory for the step (e.g. 512MiB, 24GiB): an out-of-memory error
    beyond it, and the memory fixes measured to fit it. On the CPU the process's data may grow by this much
    beyond what it held when the script started; where CUDA is available, the CUDA allocator is capped."""
    job_what_if_budget_s: float = field(default=180.0, metadata=flag("--job-what-if-budget", "SECONDS"))
    """On several processes: seconds for timing fixes on every rank, as runs of the whole job."""
    job_what_if_rounds: int = field(default=3, metadata=flag("--job-what-if-rounds", "N"))
    """On several processes: at most this many rounds of the job per fix timed (2 at least, which the
    judgement needs)."""
    job_what_if_rules: tuple[str, ...] | None = field(default=None, metadata=flag("--job-what-if-rules", "RULES"))
    """On several processes: time only these rules' fixes on every rank (comma-separated rule ids, e.g.
    straggler); the others keep their estimates."""

    def _check(self) -> None:
        at_least = {"steps": 1, "warmup": 1, "profile_steps": 0, "verify_rounds": 1, "job_what_if_rounds": 2}
        for name, least in at_least.items():
            value = getattr(self, name)
            if value < least:
                why = {
                    "warmup": " (the first step holds the script's set-up time)",
                    "job_what_if_rounds": " (a fix's gain is judged by two rounds that agree)",
                }.get(name, "")
                raise ConfigError(f"{_named(name)}: {value} is not allowed; expected an integer >= {least}{why}.")
        budgets = ("what_if_budget_s", "watch_s", "verify_budget_s", "job_what_if_budget_s", "hang_timeout_s")
        for name in ("record_budget_s", *budgets):
            value = getattr(self, name)
            if value is None and name == "what_if_budget_s":  # sized by the step when the run is read
                continue
            if not value >= (1e-9 if name == "hang_timeout_s" else 0):  # NaN fails too
                raise ConfigError(f"{_named(name)}: {value:g} is not allowed; expected seconds >= 0.")
        if self.memory_limit_bytes is not None and self.memory_limit_bytes <= 0:
            raise ConfigError(
                f"{_named('memory_limit_bytes')}: {self.memory_limit_bytes} is not allowed; expected bytes > 0."
            )
        for name in ("fix_rules", "job_what_if_rules"):
            rules = getattr(self, name)
            if rules is not None:
                _check_rule_ids(name, rules)


def _named(name: str) -> str:
    """``DoctorOptions.steps (--steps)``: both names, for errors the Python API and the command share."""
    option = next(f for f in dataclasses.fields(DoctorOptions) if f.name == name)
    cli = option.metadata.get("flag")
    return f"DoctorOptions.{name}" + (f" ({cli})" if cli else "")


def _check_rule_ids(name: str, rules: tuple[str, ...]) -> None:
    from .rule_ids import rule_ids  # the rule modules' names: none of them imported

    known = rule_ids()
    unknown = [r for r in rules if r not in known]
    if unknown:
        raise ConfigError(f"{_named(name)}: {', '.join(unknown)} is not a rule id; rule ids: {', '.join(known)}")


def _rule_list(value: str) -> tuple[str, ...]:
    return tuple(r.strip() for r in value.split(",") if r.strip())


def _size(flag_name: str) -> Any:
    def parse(text: str) -> int:
        try:
            return parse_size(text, flag_name)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def add_option_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field that has one: its type, default and help from the field and its docstring."""
    docs = field_docs(DoctorOptions)
    hints = typing.get_type_hints(DoctorOptions)
    for option in dataclasses.fields(DoctorOptions):
        name = option.metadata.get("flag")
        if name is None:
            continue
        hint, default = hints[option.name], option.default
        if type(None) in typing.get_args(hint):  # an Optional field: its flag takes the type it holds
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        text = docs[option.name].rstrip(".")
        if hint is bool:
            parser.add_argument(
                name, dest=option.name, action="store_false" if default else "store_true", default=default, help=text
            )
            continue
        kind: Any = {int: int, float: float}.get(hint, str)
        if option.name.endswith("_rules"):
            kind = _rule_list
        elif option.name.endswith("_bytes"):
            kind = _size(name)
        parser.add_argument(
            name,
            dest=option.name,
            type=kind,
            default=default,
            metavar=option.metadata.get("metavar"),
            help=text + _default_text(default),
        )


def _default_text(default: Any) -> str:
    if default is None:
        return ""
    return f" (default {default:g})" if isinstance(default, float) else f" (default {default})"


def options_from_args(args: argparse.Namespace) -> DoctorOptions:
    """The options the command's flags ask for, checked like any DoctorOptions."""
    flagged = [f.name for f in dataclasses.fields(DoctorOptions) if f.metadata.get("flag")]
    return DoctorOptions(**{name: getattr(args, name) for name in flagged})
