"""Interleaved repeats: round r of every plan before round r+1 of any, so a slow patch of a shared
machine hits all plans alike. Both runners (model workloads, data workload) time their plans this way."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .ablation import Candidate

__all__ = ["Progress", "run_interleaved"]

Progress = Callable[[str], None]  # told what the run is doing, one line at a time


def run_interleaved(
    name: str,
    measured: list[Candidate],
    repeats: int,
    progress: Progress,
    run_one: Callable[[int, int, Candidate], Any],
) -> dict[int, list[Any]]:
    """``run_one(round, index, cand)`` for round r of every plan before round r+1 of any; trials by ``id(cand)``."""
    trials: dict[int, list[Any]] = {id(c): [] for c in measured}
    for rnd in range(repeats):
        for k, cand in enumerate(measured):
            done = trials[id(cand)]
            if done and not done[-1].ok:
                continue  # a plan that failed once is reported, not retried
            progress(f"{name}: round {rnd + 1}/{repeats}, {cand.label}")
            if cand.plan.compile is not False:  # type: ignore[union-attr]  # a measured candidate has a plan
                torch.compiler.reset()  # each repeat compiles again: cold the first time, then from the disk cache
            done.append(run_one(rnd, k, cand))
    return trials
