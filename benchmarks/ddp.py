"""What scaling out costs: a `turbotrain launch` start, and DDP against one process.

    python benchmarks/ddp.py                 # CPU: launch cost; 2 processes (gloo) vs 1 on mlp and cnn
    python benchmarks/ddp.py --device cuda   # GPU: DDP overhead vs one process at the same per-GPU batch,
                                             #      and scaling to every visible GPU (NCCL)

Every figure is measured in this run, repeated (--repeats), and printed as median and
spread (max-min over median). Throughput comes from the Trainer's own steady-state counter
(FitResult.samples_per_s, summed over ranks), so warm-up and start-up are not in it; the
start-up is what the launch-cost table shows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve()

TRIVIAL = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
"""


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(key, None)
    env.update(extra)
    return env


def _launch(nproc: int, *args: str, env: dict[str, str] | None = None) -> list[str]:
    return [sys.executable, "-m", "turbotrain", "launch", "--nproc-per-node", str(nproc), *args]


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - started


def _stats(values: list[float]) -> tuple[float, float]:
    median = statistics.median(values)
    return median, (max(values) - min(values)) / median if median else 0.0


# -- the worker: one training run, launched or not ---------------------------------------------

def worker(args) -> None:
    import torch

    import turbotrain as tt
    from turbotrain.bench.workloads import get_workload

    wl = get_workload(args.workload, "gpu" if args.device == "cuda" else "cpu")
    model, optimizer = wl.build(seed=0)
    plan = tt.Plan(device=args.device, strategy=args.strategy, sync_batchnorm=args.sync_batchnorm)
    trainer = tt.Trainer(model, optimizer, wl.loss_fn, plan=plan,
                         max_steps=args.steps, warmup_steps=args.warmup, log_every_n_steps=args.steps, progress=False)
    result = trainer.fit(wl.loader(args.batch_size or wl.batch_size, seed=0))
    if int(os.environ.get("RANK", 0)) == 0:
        Path(args.out).write_text(json.dumps({"samples_per_s": result.samples_per_s, "unit": wl.unit,
                                              "units_per_sample": wl.units_per_sample,
                                              "world": int(os.environ.get("WORLD_SIZE", 1)),
                                              "threads": torch.get_num_threads()}))


def _train(nproc: int | None, workload: str, args, threads: int | None, strategy: str = "auto",
           sync_batchnorm: bool = False) -> dict:
    """One run: ``nproc`` None is a plain `python` process; else `turbotrain launch --nproc-per-node nproc`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        worker_args = [str(SELF), "--worker", "--workload", workload, "--steps", str(args.steps), "--warmup",
                       str(args.warmup), "--device", args.device, "--strategy", strategy, "--out", str(out)]
        if args.batch_size:
            worker_args += ["--batch-size", str(args.batch_size)]
        if sync_batchnorm:
            worker_args.append("--sync-batchnorm")
        cmd = [sys.executable, *worker_args] if nproc is None else _launch(nproc, *worker_args)
        env = _env(**({"OMP_NUM_THREADS": str(threads)} if threads else {}))
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
        return json.loads(out.read_text())


# -- the benchmarks ----------------------------------------------------------------------------

def launch_cost(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "trivial.py"
        script.write_text(TRIVIAL)
        plain_env = _env(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
        rows = {
            "python script.py (1 process, no launcher)": ([sys.executable, str(script)], plain_env),
            "torchrun --standalone --nproc-per-node 1": (
                [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(script)],
                _env()),
            "turbotrain launch --nproc-per-node 1": (_launch(1, str(script)), _env()),
            "turbotrain launch --nproc-per-node 2": (_launch(2, str(script)), _env()),
        }
        times = {name: [] for name in rows}
        for _ in range(args.repeats):  # interleaved, so drifting machine load hits every row alike
            for name, (cmd, env) in rows.items():
                times[name].append(_timed(cmd, env))
    base = statistics.median(times["python script.py (1 process, no launcher)"])
    print("\n## launch cost: start, init_process_group(gloo), barrier, exit (wall seconds)")
    print(f"| command | median s | spread | vs plain python |\n|---|---|---|---|")
    for name, values in times.items():
        median, spread = _stats(values)
        print(f"| {name} | {median:.2f} | {spread:.0%} | +{median - base:.2f} s |")


def ddp_vs_one(args) -> None:
    if args.device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
        rows = {"1 process, 1 GPU": (None, None, "auto", False),
                "DDP, 1 process, 1 GPU (DDP's own overhead)": (1, None, "ddp", False)}
        if gpus > 1:
            rows[f"DDP, {gpus} processes, {gpus} GPUs"] = (gpus, None, "ddp", False)
            # SyncBatchNorm only synchronizes with several processes (and only on GPUs)
            rows[f"DDP + SyncBatchNorm, {gpus} processes (BatchNorm models)"] = (gpus, None, "ddp", True)
    else:
        cores = len(os.sched_getaffinity(0))
        # The first row is the baseline: one process with what each DDP rank gets (torchrun sets
        # OMP_NUM_THREADS=1 per process); the all-cores row shows what one process makes of the machine.
        rows = {"1 process, 1 thread": (None, 1, "auto", False),
                f"1 process, {cores} threads": (None, cores, "auto", False),
                "DDP, 2 processes x 1 thread (gloo)": (2, 1, "ddp", False)}
    for workload in args.workloads:
        results = {name: [] for name in rows}
        unit = ""
        for _ in range(args.repeats):
            for name, (nproc, threads, strategy, sync_bn) in rows.items():
                if sync_bn and workload != "cnn":
                    continue
                r = _train(nproc, workload, args, threads, strategy, sync_bn)
                unit = r["unit"]
                results[name].append(r["samples_per_s"] * r["units_per_sample"])
        first = statistics.median(next(iter(results.values())))
        print(f"\n## {workload}: training throughput at the same per-process batch ({unit}/s, all ranks together)")
        print(f"| run | median {unit}/s | spread | vs first row |\n|---|---|---|---|")
        for name, values in results.items():
            if not values:
                continue
            median, spread = _stats(values)
            print(f"| {name} | {median:,.0f} | {spread:.0%} | {median / first:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--workloads", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=None, help="per process (default: the workload's)")
    parser.add_argument("--skip-launch-cost", action="store_true")
    # worker mode (internal)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workload", default="mlp", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sync-batchnorm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    import torch

    from turbotrain.hardware import detect

    print(f"# benchmarks/ddp.py on {detect('cpu').device_name}, "
          f"{len(os.sched_getaffinity(0))} cores, torch {torch.__version__}, device {args.device}, "
          f"{args.repeats} repeats, {args.steps} steps ({args.warmup} warm-up)")
    if not args.skip_launch_cost:
        launch_cost(args)
    ddp_vs_one(args)


if __name__ == "__main__":
    main()
