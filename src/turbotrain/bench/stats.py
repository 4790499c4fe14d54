"""When a measured difference is a speed-up: repeats, their median and their spread.

Each plan is measured in several repeats, interleaved with the other plans (round r of every
plan runs before round r+1 of any), so a slow patch of the machine hits all plans alike.
A speed-up is the median over rounds of (plan throughput / baseline throughput in the same
round). It is *called* a speed-up (or a slow-down) only when it is further from 1 than the
spread of those per-round ratios, (max - min) / median: when the repeats disagree by more
than the effect, the effect is not claimed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Comparison", "relative_spread", "compare", "FASTER", "SLOWER", "NOISE", "UNVERIFIED",
           "MIN_REPEATS_TO_CALL"]

FASTER, SLOWER, NOISE, UNVERIFIED = "faster", "slower", "within noise", "unverified"

# Two repeats that happen to agree say little on a shared machine; three is the least to call from.
MIN_REPEATS_TO_CALL = 3


@dataclass(frozen=True)
class Comparison:
    speedup: float       # median over rounds of candidate / baseline throughput
    noise: float         # relative spread of the per-round ratios; a speed-up must exceed it
    verdict: str         # FASTER, SLOWER, NOISE, or UNVERIFIED (fewer than MIN_REPEATS_TO_CALL repeats)

    @property
    def called(self) -> bool:
        return self.verdict in (FASTER, SLOWER)


def relative_spread(values: Sequence[float]) -> float:
    """(max - min) / median of repeated measurements; 0 for fewer than two."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid > 0 else math.inf


def compare(candidate: Sequence[float], baseline: Sequence[float]) -> Comparison:
    """Compare per-round throughputs (higher is better) of a candidate and its baseline.

    ``candidate[r]`` and ``baseline[r]`` must come from the same round ``r``.
    """
    if len(candidate) != len(baseline) or not candidate:
        raise ValueError(f"need the same number (>0) of rounds, got {len(candidate)} and {len(baseline)}")
    ratios = [c / b if b > 0 else math.inf for c, b in zip(candidate, baseline)]
    speedup = statistics.median(ratios)
    # Paired by round: a load spike that slows both plans of a round leaves their ratio alone.
    noise = relative_spread(ratios)
    if len(candidate) < MIN_REPEATS_TO_CALL:
        verdict = UNVERIFIED
    elif speedup > 1 + noise:
        verdict = FASTER
    elif speedup < 1 / (1 + noise):  # the same margin on a log scale, so 2x faster and 2x slower mirror
        verdict = SLOWER
    else:
        verdict = NOISE
    return Comparison(speedup, noise, verdict)
