"""Do the patched script's losses match the original's, step for step? Bitwise for exact fixes; within
the numerics guard's tolerance (``turbotrain.tune.guard``) for precision changes, and labelled so."""

from __future__ import annotations

import math
from typing import Any, Sequence

from ...tuning.guard import DEFAULT_TOLERANCE, check_losses
from .model import EXACT, PRECISION, REINITIALISED, RESAMPLED

__all__ = ["loss_match", "weakest"]

# Weakest last: fixes patched together promise what the weakest of them does (not compared beats a tolerance).
_ORDER = (EXACT, PRECISION, REINITIALISED, RESAMPLED)


def weakest(kinds: Sequence[str]) -> str:
    """What several fixes together can promise: the weakest of their numerics."""
    for kind in reversed(_ORDER):
        if kind in kinds:
            return kind
    return next((k for k in kinds if k not in _ORDER), EXACT)


def _bitwise(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def _max_rel(a: Sequence[float], b: Sequence[float]) -> float:
    worst = 0.0
    for x, y in zip(a, b):
        if not (math.isfinite(x) and math.isfinite(y)):
            return math.inf if (math.isfinite(x) != math.isfinite(y)) else worst
        worst = max(worst, abs(x - y) / max(abs(x), 1e-12))
    return worst


def loss_match(
    numerics: str, original: Sequence[float], patched: Sequence[float], original_again: Sequence[float] | None = None
) -> dict[str, Any]:
    """``{"expected", "match", "compared", "max_rel_diff", ...}`` for the losses of the same steps.

    ``original_again``: a second run of the original; when it differs from the first, the script is not
    deterministic run to run (an unseeded random draw), and bitwise cannot be asked of the patch either.
    """
    steps = min(len(original), len(patched))
    out: dict[str, Any] = {"compared": steps, "max_rel_diff": None, "match": None}
    if not steps:
        out.update(expected="none", note="no losses to compare (no scalar loss went through backward)")
        return out
    a, b = list(original[:steps]), list(patched[:steps])
    diff = _max_rel(a, b)
    out["max_rel_diff"] = float(f"{diff:.3g}") if math.isfinite(diff) else None
    if len(original) != len(patched):
        out["note"] = f"the runs took {len(original)} and {len(patched)} losses; the first {steps} are compared"
    if original_again is not None and not _bitwise(a, list(original_again[:steps])):
        numerics, out["note"] = PRECISION, "the original's own losses differ from run to run (unseeded randomness?)"
    if numerics == EXACT:
        out.update(expected="bitwise", match=_bitwise(a, b))
        if not out["match"]:
            out["note"] = (
                out.get("note", "") + f" not bitwise equal; the largest relative difference is {out['max_rel_diff']}"
            ).strip()
        return out
    if numerics == PRECISION:
        verdict = check_losses(a, b, DEFAULT_TOLERANCE) if all(map(math.isfinite, a)) else None
        out.update(expected="tolerance", tolerance=DEFAULT_TOLERANCE, match=bool(verdict and verdict.ok))
        if verdict is not None and verdict.reason:
            out["note"] = verdict.reason
        return out
    out.update(
        expected="none",
        note="the patched step draws its own dropout masks (inside the fused attention), so each "
        "step's loss differs by dropout's noise"
        if numerics == RESAMPLED
        else "the patched model draws other random numbers when it is built (a parameter fewer), so "
        "it starts from other weights",
    )
    return out
