"""The calibration scripts' own clock: steady-state time per training step, printed on the last line.

Every script in this folder drives its loop with ``for step in timed_steps(...)``: the first
``warmup`` iterations are not timed; every later one is timed whole with ``time.perf_counter``
(data loading, forward, backward, optimizer, and any validation, checkpoint or logging the loop does).
When the loop ends the script prints

    STEP_MS <ms per step> MEAN_MS <plain mean> SAMPLES <samples per step>

``STEP_MS`` is the median over blocks of ``BLOCK`` consecutive steps of each block's mean: a block
holds whole periods of work done every 5 or 10 steps (validation, checkpoints), which a fix may
remove and a per-step median would leave out, while a neighbour's burst of load on this shared
machine spoils one block, not the figure. Work done less often than every ``BLOCK`` steps (the fixed
twins' every-50 cadences) falls out of the median, as it does out of the cost it was meant to be.
``SAMPLES`` lets a pair whose fix changes the batch size be compared in samples/s. A second line,

    PEAK_BYTES <peak> START_BYTES <at the first timed step>

is the memory peak over the timed steps as ``doctor --verify`` measures it (the process's resident peak on the
CPU, the allocator's on a GPU): benchmarks/memory_calibration.py sets it against the memory doctor's figures.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Iterator

import torch

from turbotrain.doctor.record.window_memory import PeakProbe

__all__ = ["steps_from_argv", "timed_steps"]

BLOCK = 10


def steps_from_argv(default: int = 60) -> int:
    """``--steps N`` from the command line: the timed steps, after the warm-up."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=default)
    return parser.parse_known_args()[0].steps


def timed_steps(steps: int, warmup: int = 5, samples: int = 1) -> Iterator[int]:
    """Yield ``warmup + steps`` step indices; time each iteration after the warm-up; print the summary line.

    A smoke run (``--steps 2``) warms up for no more steps than it times."""
    warmup = min(warmup, steps)
    times = []
    probe = PeakProbe(gpu=torch.cuda.is_available())
    for step in range(warmup + steps):
        if step == warmup:
            probe.start()
        started = time.perf_counter()
        yield step
        if step >= warmup:
            times.append(time.perf_counter() - started)
    mean = sum(times) / max(1, len(times))
    blocks = [sum(times[i:i + BLOCK]) / BLOCK for i in range(0, len(times) - BLOCK + 1, BLOCK)]
    per_step = statistics.median(blocks) if blocks else mean
    print(f"STEP_MS {per_step * 1e3:.3f} MEAN_MS {mean * 1e3:.3f} SAMPLES {samples}", flush=True)
    memory = probe.stop()
    if memory is not None:
        print(f"PEAK_BYTES {memory.peak_bytes} START_BYTES {memory.start_bytes}", flush=True)
