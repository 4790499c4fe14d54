"""``doctor --verify`` on a multi-process job: the original and the patched script, each run by the user's own
launcher with every rank recorded, interleaved in rounds like a single script's (:mod:`.verify`).

A run's steps are the job's: each measured step's time is its slowest rank's (every rank ends the step at the
same all-reduce). Its losses are every rank's, step by step (rank 0's, rank 1's, ... of each step).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..job.launcher import RankOutcome, run_job
from ..whatif.job import job_steps_ms
from .verify import Verifier, VerifyOptions, TimedRun

__all__ = ["JobVerifier"]


class JobVerifier(Verifier):
    """Copies of the script's folder, each run as the job: ``command`` with its script swapped for the copy's."""

    def __init__(self, command: list[str], script: str, base: str, options: VerifyOptions, hang_timeout_s: float):
        super().__init__(script, [], base, options)
        self.command, self.hang_timeout_s = list(command), hang_timeout_s

    def _command_in(self, folder: Path) -> list[str]:
        script = os.path.realpath(self.script)
        copy = str(folder / os.path.relpath(script, os.path.realpath(self.base)))
        return [copy if arg.endswith(".py") and os.path.realpath(arg) == script else arg for arg in self.command]

    def run(self, folder: Path, steps: int) -> TimedRun:
        started = time.perf_counter()
        job = run_job(
            self._command_in(folder),
            steps=steps,
            warmup=self.options.warmup,
            profile=0,
            hang_timeout_s=self.hang_timeout_s,
            cwd=self._cwd(folder),
            losses=True,
            warm=True,
        )
        wall = time.perf_counter() - started
        self.run_s = max(self.run_s, wall)
        if job.failure is not None:
            return TimedRun(error=job.failure, wall_s=wall)
        step_ms = job_steps_ms(job)
        if not step_ms:
            return TimedRun(error="no step was measured on every rank", wall_s=wall)
        return TimedRun(step_ms, _losses(job.ranks), wall_s=wall)


def _losses(ranks: list[RankOutcome]) -> list[float]:
    """Every rank's losses interleaved step by step, over the steps every rank took."""
    ordered = sorted(ranks, key=lambda r: r.rank)
    per_rank = [[float.fromhex(v) for v in (r.run or {}).get("losses", [])] for r in ordered]
    return [loss for step in zip(*per_rank) for loss in step]
