"""The numerics guard: a faster plan is only accepted if it trains like the fp32 baseline.

Every trial starts from the same weights, the same seed and the same batches, so the loss
of step ``i`` under a candidate is directly comparable with step ``i`` under the baseline.
Exact switches match to float rounding; bf16 autocast stays within about 1% on the
reference workloads over 40 steps. A switch that changes what is computed drifts far more,
and one that overflows turns non-finite: both are rejected with the step and the size of
the departure in the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Verdict", "check_losses", "DEFAULT_TOLERANCE"]

DEFAULT_TOLERANCE = 0.05
"""Largest relative departure of any step's loss from the baseline's (measured honest switches: < 0.01)."""

_FLOOR = 0.05
"""Losses are compared relative to max(|baseline loss|, 5% of the first baseline loss), so a
loss that trains towards zero is not judged on the noise of its last digits."""


@dataclass(frozen=True)
class Verdict:
    ok: bool
    max_deviation: float  # largest relative departure over the compared steps
    worst_step: int | None
    reason: str | None = None  # why the candidate is rejected (None when ok)


def check_losses(
    baseline: Sequence[float], candidate: Sequence[float], tolerance: float = DEFAULT_TOLERANCE
) -> Verdict:
    """Compare a candidate's per-step losses with the baseline's (fp32, same weights, same batches)."""
    if not baseline:
        raise ValueError("the baseline trial recorded no losses to compare against")
    bad_base = next((i for i, v in enumerate(baseline) if not math.isfinite(v)), None)
    if bad_base is not None:
        raise ValueError(
            f"the baseline (naive plan) loss is {baseline[bad_base]} at step {bad_base}: the model does "
            "not train in fp32 on these batches, so there is nothing to compare candidates against; "
            "fix the model, the loss or the learning rate first"
        )
    for i, value in enumerate(candidate):
        if not math.isfinite(value):
            return Verdict(
                False, math.inf, i, f"loss became {value} at step {i} (the baseline's was {baseline[i]:.4g})"
            )
    steps = min(len(baseline), len(candidate))
    if steps == 0:
        return Verdict(False, math.inf, None, "the candidate recorded no losses")
    floor = _FLOOR * abs(baseline[0])
    worst, worst_step = 0.0, 0
    for i in range(steps):
        deviation = abs(candidate[i] - baseline[i]) / max(abs(baseline[i]), floor, 1e-12)
        if deviation > worst:
            worst, worst_step = deviation, i
    if worst > tolerance:
        return Verdict(
            False,
            worst,
            worst_step,
            f"loss off fp32 by {worst:.1%} at step {worst_step} "
            f"({candidate[worst_step]:.4g} vs {baseline[worst_step]:.4g}; tolerance {tolerance:.0%})",
        )
    return Verdict(True, worst, worst_step)
