"""Gradient accumulation under DDP: all-reduces per optimizer step with and without no_sync.

    python benchmarks/accumulation.py                  # 2 CPU processes (gloo), the gpt workload
    python benchmarks/accumulation.py --device cuda --nproc 2

It starts itself under `turbotrain launch`. Each rank trains the same workload with the
Trainer for several accumulation settings, twice: as turbotrain does it (DDP ``no_sync``
on every micro-batch but the last) and as a plain loop without ``no_sync`` does it (the
Trainer with its no_sync disabled, nothing else changed). A DDP communication hook counts
the bucket all-reduces; the Trainer's steady-state counter gives the throughput.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run_one(args, accum: int, use_no_sync: bool) -> tuple[float, float, float]:
    """(gradient synchronizations and bucket all-reduces per optimizer step, samples/s over all ranks)."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    import turbotrain as tt
    from turbotrain.bench.workloads import get_workload

    wl = get_workload(args.workload, "gpu" if args.device == "cuda" else "cpu")
    model, optimizer = wl.build(seed=0)
    trainer = tt.Trainer(model, optimizer, wl.loss_fn,
                         plan=tt.Plan(device=args.device, strategy="ddp", grad_accum_steps=accum),
                         max_steps=args.steps, warmup_steps=args.warmup, log_every_n_steps=args.steps, progress=False)
    calls, syncs = [0], [0]

    def counting_hook(state, bucket):
        calls[0] += 1
        syncs[0] += bucket.index() == 0  # every synchronization all-reduces bucket 0 once
        return default_hooks.allreduce_hook(state, bucket)

    trainer.rt.ddp.register_comm_hook(dist.group.WORLD, counting_hook)
    if not use_no_sync:
        trainer.rt.no_sync = lambda skip: contextlib.nullcontext()  # a loop that synchronizes every backward
    result = trainer.fit(wl.loader(args.micro_batch, seed=0))
    return syncs[0] / result.steps, calls[0] / result.steps, result.samples_per_s * wl.units_per_sample  # units/s


def worker(args) -> None:
    import torch

    rank0 = int(os.environ["RANK"]) == 0
    rows = []
    for accum in args.accum:
        for use_no_sync in (True, False):
            if accum == 1 and not use_no_sync:
                continue  # identical to the no_sync row: nothing to skip with one micro-batch
            measured = [_run_one(args, accum, use_no_sync) for _ in range(args.repeats)]
            rows.append((accum, use_no_sync, measured[0][0], measured[0][1], [rate for _, _, rate in measured]))
    if not rank0:
        return
    from turbotrain.hardware import detect

    print(f"# benchmarks/accumulation.py: {args.workload}, {os.environ['WORLD_SIZE']} processes ({args.device}), "
          f"micro-batch {args.micro_batch} per process, {args.steps} optimizer steps ({args.warmup} warm-up), "
          f"{args.repeats} repeats; {detect(args.device).device_name}, torch {torch.__version__}")
    from turbotrain.bench.workloads import get_workload

    unit = get_workload(args.workload).unit
    print("| grad_accum_steps | gradient sync | synchronizations per optimizer step | bucket all-reduces per step "
          f"| {unit}/s (median) | spread | vs no_sync |\n|---|---|---|---|---|---|---|")
    base = {accum: statistics.median(rates) for accum, no_sync, _, _, rates in rows if no_sync}
    for accum, no_sync, syncs, calls, rates in rows:
        median = statistics.median(rates)
        spread = (max(rates) - min(rates)) / median
        print(f"| {accum} | {'last micro-batch only (no_sync)' if no_sync else 'every micro-batch'} | {syncs:g} "
              f"| {calls:.2f} | {median:,.0f} | {spread:.0%} | {median / base[accum]:.2f}x |")
    print("(DDP packs the gradients into buckets and all-reduces each; it re-buckets after the first step.)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--workload", default="gpt")
    parser.add_argument("--accum", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args)
        return
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "turbotrain", "launch", "--nproc-per-node", str(args.nproc), __file__, *sys.argv[1:]]
    sys.exit(subprocess.run(cmd, cwd=ROOT, env=env).returncode)


if __name__ == "__main__":
    main()
