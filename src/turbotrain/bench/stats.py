"""When a measured difference is a speed-up, for the bench: repeats, interleaved, judged by
:func:`turbotrain.measure.judge`.

Each plan is measured in several repeats, interleaved with the other plans (round r of every
plan runs before round r+1 of any), so a slow patch of the machine hits all plans alike.
A speed-up is the median over rounds of (plan throughput / baseline throughput in the same
round), judged by the project's one noise model (:func:`turbotrain.measure.judge`): it is
*called* a speed-up (or a slow-down) only when it is further from 1 than the spread of those
per-round ratios, and only from three repeats on.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..measure import FASTER, NOISE, SLOWER, UNVERIFIED, Comparison, judge, relative_spread

__all__ = ["Comparison", "relative_spread", "compare", "FASTER", "SLOWER", "NOISE", "UNVERIFIED", "MIN_REPEATS_TO_CALL"]

# Two repeats that happen to agree say little on a shared machine; three is the least to call from.
MIN_REPEATS_TO_CALL = 3


def compare(candidate: Sequence[float], baseline: Sequence[float]) -> Comparison:
    """Compare per-round throughputs (higher is better) of a candidate and its baseline.

    ``candidate[r]`` and ``baseline[r]`` must come from the same round ``r``.
    """
    if len(candidate) != len(baseline) or not candidate:
        raise ValueError(f"need the same number (>0) of rounds, got {len(candidate)} and {len(baseline)}")
    ratios = [c / b if b > 0 else math.inf for c, b in zip(candidate, baseline)]
    # The bench has its own noise floor in the spread of its repeats: no minimum gain on top.
    return judge(ratios, min_gain=0.0, min_rounds=MIN_REPEATS_TO_CALL)
