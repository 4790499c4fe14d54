"""Pipeline parallelism: memory per process and speed, one process against 2 stages and 2 x 2 pipeline x FSDP.

    python benchmarks/pipeline.py                 # CPU (gloo), a few minutes
    python benchmarks/pipeline.py --device cuda   # one process per GPU (NCCL)

A GPT (the bench workload's layout, embeddings untied: a pipeline refuses weights shared between
stages) big enough that its weights, gradients and AdamW state dominate a process's memory, trained
on byte-level text for a few steps in each configuration:

* 1 process: the whole model, built for real, the same global batch per step;
* 2 stages, GPipe and 1F1B: the model built on the meta device, each process materialising its stage;
* 2 x 2 pipeline x FSDP: 4 processes, 2 stages, each stage sharded over 2 replicas (twice the global batch).

Per configuration: peak resident memory (RSS) of each process, the parameter + gradient + optimizer
bytes it holds (counted), steps/s and tokens/s from the Trainer's steady-state counter, and the
schedule's bubble fraction (p - 1) / (m + p - 1). Speed is not the promise on a CPU with two cores
(the stages share them); memory is.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(key, None)
    return env


def _gpt(args, meta: bool):
    import torch
    from torch import nn

    from turbotrain.bench.models import GPT

    with torch.device("meta" if meta else "cpu"):
        torch.manual_seed(0)
        model = GPT(vocab_size=256, seq_len=args.seq_len, dim=args.dim, layers=args.layers, heads=args.heads)
        model.head.weight = nn.Parameter(torch.empty_like(model.tok.weight))  # untied
        if not meta:
            nn.init.normal_(model.head.weight, std=0.02)
    return model


def worker(args) -> None:
    import torch

    import turbotrain as tt
    from turbotrain.bench.models import lm_loss
    from turbotrain.bench.datasets import text_dataset

    rank = int(os.environ.get("RANK", 0))
    pipeline = args.schedule != "none"
    model = _gpt(args, meta=pipeline)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    plan = tt.Plan(device=args.device, strategy="pipeline", pipeline_stages=2, microbatches=args.microbatches,
                   schedule=args.schedule) if pipeline else tt.Plan(device=args.device)
    state_bytes = [0]

    def count(opt, *_):  # before the step: parameters, gradients and the optimizer state held right then
        tensors = [p for g in opt.param_groups for p in g["params"]]
        tensors += [p.grad for p in tensors if p.grad is not None]
        tensors += [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
        local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
        state_bytes[0] = max(state_bytes[0], sum(t.numel() * t.element_size() for t in local))

    optimizer.register_step_pre_hook(count)
    data = text_dataset(args.batch * (args.steps + 2) * 2, args.seq_len)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=False, drop_last=True)
    trainer = tt.Trainer(model, optimizer, lm_loss, plan=plan, split_points=[f"blocks.{args.layers // 2}"]
                         if pipeline else None, max_steps=args.steps, warmup_steps=args.warmup,
                         log_every_n_steps=args.steps, progress=False)
    result = trainer.fit(loader)
    replicas = trainer.pipeline.layout.dp if pipeline and trainer.pipeline.launched else 1
    record = {"rank": rank, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else None,
              "state_mib": state_bytes[0] / 2**20, "samples_per_s": result.samples_per_s,
              "steps_per_s": result.samples_per_s / (args.batch * replicas), "global_batch": args.batch * replicas}
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(record))


def run(nproc: int, schedule: str, args) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        worker_args = [str(SELF), "--worker", "--out", tmp, "--schedule", schedule, "--device", args.device]
        for name in ("dim", "layers", "heads", "seq_len", "batch", "microbatches", "steps", "warmup"):
            worker_args += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        cmd = [sys.executable, "-m", "turbotrain", "launch", "--nproc-per-node", str(nproc), *worker_args]
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
        if proc.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
        records = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank*.json"))]
        for r in records:
            r["wall_s"] = time.perf_counter() - started
        return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--schedule", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="samples per step (per pipeline)")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    import torch

    from turbotrain.launch.pipeline import Layout, bubble_fraction

    model = _gpt(args, meta=True)
    params = sum(p.numel() for p in model.parameters())
    print(f"GPT: dim {args.dim}, {args.layers} layers, seq {args.seq_len}, {params / 1e6:.1f} M parameters "
          f"({params * 4 / 2**20:.0f} MiB fp32; with gradients and AdamW's two moments {params * 16 / 2**20:.0f} MiB); "
          f"batch {args.batch} per pipeline, {args.microbatches} micro-batches; torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs")
    rows = [("1 process (whole model)", 1, "none"), ("2 stages, GPipe", 2, "gpipe"), ("2 stages, 1F1B", 2, "1f1b"),
            ("2 x 2 pipeline x FSDP (1F1B)", 4, "1f1b")]
    bubble = bubble_fraction(Layout(2, 1, 2, 1, args.microbatches, "1f1b"))
    print("\n| configuration | processes | peak RSS per process (MiB) | params+grads+AdamW per process (MiB) | "
          "global batch | steps/s | tokens/s | bubble |\n|---|---|---|---|---|---|---|---|")
    for name, nproc, schedule in rows:
        records = run(nproc, schedule, args)
        rss = " / ".join(f"{r['peak_rss_mib']:.0f}" + (f" (GPU {r['peak_gpu_mib']:.0f})" if r["peak_gpu_mib"] else "")
                         for r in records)
        state = " / ".join(f"{r['state_mib']:.0f}" for r in records)
        rate = max(r["samples_per_s"] for r in records)  # every rank reports the pipeline's reduced rate
        steps = max(r["steps_per_s"] for r in records)
        print(f"| {name} | {nproc} | {rss} | {state} | {records[0]['global_batch']} | {steps:.2f} | "
              f"{rate * args.seq_len:.0f} | {'-' if schedule == 'none' else f'{bubble:.0%}'} |", flush=True)


if __name__ == "__main__":
    main()
