"""One run of a script for ``doctor --verify``: under the doctor's recorder, its step times and losses as JSON.

``python -m turbotrain.doctor.fixes.child --steps N --warmup W --out run.json script.py [args...]``

Each run is its own process, so nothing one script sets (``cudnn.benchmark``, torch's threads, a
module-level cache) can leak into the other side of the comparison. The losses are the scalar
tensors passed to ``backward`` (kept as tensors and read after the run: no sync added to a step).
"""

from __future__ import annotations

import argparse
import json
import sys
import torch

from ...fresh_trial import die_with_parent
from ..analysis.context import loader_round
from ..analysis.machine import others_share
from ..record.graph_watch import GraphGrowth
from ..record.loss_tap import LossTap
from ..record.memory_limit import memory_limit
from ..record.recorder import Recorder
from ..record.runner import run_script
from ..record.window_memory import PeakProbe

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m turbotrain.doctor.fixes.child")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--memory-limit", type=int, default=None, help="bytes: the doctor's --memory-limit")
    parser.add_argument("--parent", type=int, default=0, help="the doctor's pid: this run ends when it does")
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    if args.threads:
        torch.set_num_threads(args.threads)  # the thread count the doctor's own run had
    recorder = Recorder(
        measure=args.steps, warmup=args.warmup, profile=0, capture=False, trace_ranges=False, sees_construction=True
    )
    # Both sides of a comparison run the same steps: the window is never extended to find a period (the
    # verifier picks whole periods itself). Warm-up still drains a DataLoader's queued batches.
    recorder.schedule.extends_for_period = False
    # One unmeasured step after the window: a third step boundary at which the graphs alive are counted (the
    # memory a fix frees is checked beside the time).
    assert recorder.schedule.stop_after is not None  # a measured window with an end
    recorder.schedule.stop_after += 1
    # The memory peak over the measured steps, set beside the time (a fix that frees memory is checked for it).
    recorder.peak_probe = PeakProbe(recorder.gpu)
    with LossTap() as tap, memory_limit(args.memory_limit):
        run = run_script(args.script, list(args.script_args), recorder)
    recording = recorder.recording()
    warmup = recording.window.warmup
    steps = recording.steps[warmup : warmup + args.steps]
    # What another process took from a step (run-queue wait) is not the script's; what its own workers took is.
    theirs = others_share((recording.load_start, recording.load_end))
    out = {
        "status": run.status,
        "error": run.error,
        "warmup": warmup,
        "step_s": [s.duration - (s.preempted or 0.0) * theirs for s in steps],
        "loader_round": loader_round(list(recording.loaders), [s.index for s in steps]),
        "losses": [v.hex() for v in tap.values()],
        "graphs": _graphs(recording.graph_growth),
        "memory": recorder.window_memory.to_dict() if recorder.window_memory is not None else None,
        "out_of_memory": recording.out_of_memory is not None,  # the error it died of, read from the exception
    }
    with open(args.out, "w") as fh:
        json.dump(out, fh)
    return 0 if not run.failed else 1


def _graphs(growth: GraphGrowth | None) -> dict[str, object] | None:
    """The autograd graphs alive at the counted step boundaries, and whether they grew (a step's graph kept)."""
    if growth is None:
        return None
    return {
        "steps": list(growth.steps),
        "tensors": list(growth.tensors),
        "bytes": list(growth.bytes),
        "growing": growth.growing,
        "bytes_per_step": growth.bytes_per_step,
        "nodes_per_step": growth.nodes_per_step,
    }


if __name__ == "__main__":
    sys.exit(main())
