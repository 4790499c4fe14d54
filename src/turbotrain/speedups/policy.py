"""What a speed-up declares besides applying itself: how the tuner decides it and how it is exported.

Every registry entry carries a :class:`Tuning` and an :class:`Export` (and a model predicate, see
:mod:`turbotrain.speedups.model_info`). ``tuning/candidates.py`` and ``tuning/export.py`` read these
declarations and keep no list of switches of their own, so a new switch is one module in this package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal

if TYPE_CHECKING:  # pragma: no cover
    from ..hardware import Hardware
    from ..plan import Plan

__all__ = [
    "Tuning",
    "timed",
    "by_finder",
    "by_rule",
    "not_tuned",
    "TUNE_KINDS",
    "Export",
    "ExportError",
    "FRAMEWORKS",
    "call_text",
]

TuneKind = Literal["timed", "finder", "by_rule", "not_tuned"]
TUNE_KINDS: tuple[str, ...] = ("timed", "finder", "by_rule", "not_tuned")


@dataclass(frozen=True)
class Tuning:
    """How ``tt.tune`` decides a switch; every entry is in exactly one of four kinds.

    * ``timed``: tried on the user's own model in a step trial, each of ``values(hw, base)`` (best guess
      first; None: the other value of a boolean switch). ``expensive`` ones (compiles) are tried after the
      cheap ones, within the budget; ``nothing_to_try`` says why when ``values`` is empty (``{hw}`` is the
      Hardware).
    * ``finder``: decided by the finder named in ``why`` (batch size, num_workers).
    * ``by_rule``: exact, but a step trial cannot time it (it acts on the batch copy, made once before the
      timed steps): applied where the entry's ``recommend`` rule picks it.
    * ``not_tuned``: not a per-model speed choice; ``why`` is shown to the user.
    """

    kind: TuneKind
    values: Callable[["Hardware", "Plan"], tuple[Any, ...]] | None = None
    why: str = ""
    expensive: bool = False
    nothing_to_try: str = ""

    def __post_init__(self) -> None:
        if self.kind not in TUNE_KINDS:
            raise ValueError(f"Tuning kind {self.kind!r} is not one of {', '.join(TUNE_KINDS)}")
        if self.kind in ("finder", "not_tuned") and not self.why:
            raise ValueError(f"a {self.kind!r} Tuning needs `why`: the finder that decides it, or why it is not tuned")


def timed(
    values: Callable[["Hardware", "Plan"], tuple[Any, ...]] | None = None,
    *,
    expensive: bool = False,
    nothing_to_try: str = "",
) -> Tuning:
    """Timed on the user's model: ``values(hw, base)``, or the other value of a boolean switch."""
    return Tuning("timed", values, expensive=expensive, nothing_to_try=nothing_to_try)


def by_finder(finder: str) -> Tuning:
    """Decided by a finder (``finder`` names it in the tuner's report)."""
    return Tuning("finder", why=finder)


def by_rule() -> Tuning:
    """Applied where the entry's rule recommends it: a step trial cannot time it."""
    return Tuning("by_rule")


def not_tuned(why: str) -> Tuning:
    """Left out of the search; ``why`` is shown to the user."""
    return Tuning("not_tuned", why=why)


FRAMEWORKS: tuple[str, ...] = ("lightning", "accelerate")


class ExportError(ValueError):
    """A plan the framework's flags and config files cannot express; the message says what to use instead."""


@dataclass(frozen=True)
class Export:
    """How a switch is written for other frameworks (``tuning/export.py`` reads it).

    * ``lightning(plan)``: keyword arguments of ``lightning.pytorch.Trainer``, for every plan (the naive
      value too, so the flags state what the plan chose);
    * ``accelerate(plan)``: keys of an ``accelerate config`` file, for every plan;
    * ``code(plan, framework)``: plain PyTorch lines for what that framework has no flag for, empty when
      the plan leaves the switch alone;
    * ``dataloader``: the ``DataLoader`` keyword a loader switch is (None keeps the user's loader's own);
    * ``unexported``: why the entry writes nothing for either framework, so no omission is silent.

    The functions raise :class:`ExportError` for a value the framework cannot express.
    """

    lightning: Callable[["Plan"], dict[str, Any]] | None = None
    accelerate: Callable[["Plan"], dict[str, Any]] | None = None
    code: Callable[["Plan", str], list[str]] | None = None
    dataloader: str | None = None
    unexported: str = ""

    def __post_init__(self) -> None:
        writes = any((self.lightning, self.accelerate, self.code, self.dataloader))
        if writes == bool(self.unexported):
            raise ValueError(
                "an Export declares what it writes (lightning, accelerate, code or dataloader) "
                "or, alone, `unexported`: why it writes nothing"
            )

    def lightning_flags(self, plan: "Plan") -> dict[str, Any]:
        return self.lightning(plan) if self.lightning else {}

    def accelerate_keys(self, plan: "Plan") -> dict[str, Any]:
        return self.accelerate(plan) if self.accelerate else {}

    def code_lines(self, plan: "Plan", framework: str) -> list[str]:
        return self.code(plan, framework) if self.code else []


def call_text(callee: str, kwargs: dict[str, Any]) -> str:
    """``Trainer(precision='bf16-mixed')``: a call as a user would write it (the doctor's fix lines)."""
    return f"{callee}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
