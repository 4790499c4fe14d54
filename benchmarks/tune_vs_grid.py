"""Tuned plan vs the best plan of an exhaustive grid, and vs the naive plan, measured in the same run.

For each workload (the reference GPT and CNN, and a small MLP-Mixer defined here):

1. ``tt.tune`` with a 120 s budget, no cache, and a fresh torch.compile cache directory, so
   the compiles it needs are paid inside the budget: its wall time is reported.
2. The grid: every plan of precision (fp32, bf16-mixed where the hardware has bf16) x
   compile (off, on) x channels_last (off, on; models with convolutions only).
3. The tuned plan, every grid plan (the naive plan is one of them) are timed again with
   ``measure.run_trial`` in interleaved rounds, the naive plan first in each round. Each plan's
   *vs naive* is the median over the rounds of its paired ratio (the naive trial's median step over
   its own, in the same round), so load that comes and goes within a round falls on both; its
   throughput is the median over all its steady-state steps, with the spread (p10..p90 over the
   median) next to it. (Ratios of pooled medians picked compile as the GPT's best at 1.15x and
   1.24x on a 2-core AVX2-only EPYC whose steps spread 39-46%, where 12 paired rounds measured
   1.02x.) A tuned plan that is one of the grid plans is that grid row (marked "= tuned"), not
   measured twice.

Prints the table and the ratios tuned / grid best and tuned / naive (both from the paired
ratios; the pooled throughputs' ratio beside them); ``--markdown`` prints the table for
docs/benchmarks.md.

    PYTHONPATH=src python benchmarks/tune_vs_grid.py [--workloads gpt,cnn,mixer] [--budget 120] [--rounds 3]
"""

from __future__ import annotations

import os
import tempfile

# Before torch is imported: compiled kernels from earlier runs must not make tuning look fast.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="tt-inductor-"))

import argparse  # noqa: E402
import itertools  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import turbotrain as tt  # noqa: E402
from turbotrain.bench.datasets import image_dataset  # noqa: E402
from turbotrain.bench.workload import Workload  # noqa: E402
from turbotrain.bench.workloads import get_workload  # noqa: E402
from turbotrain.hardware import detect  # noqa: E402
from turbotrain.measure import Trial, run_trial  # noqa: E402
from turbotrain.tuning import tune_report  # noqa: E402


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    """A small MLP-Mixer: a strided-conv patch embedding, then token- and channel-mixing MLPs."""

    def __init__(self, size: int = 32, patch: int = 4, dim: int = 128, depth: int = 4, classes: int = 10):
        super().__init__()
        tokens = (size // patch) ** 2
        self.embed = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.Sequential(*(MixerBlock(tokens, dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(1))


def mixer_workload() -> Workload:
    return Workload("mixer", "images", 1, 64, Mixer, F.cross_entropy,
                    lambda seed: image_dataset(4096, 32, seed=seed), lr=2e-3)


def workload(name: str) -> Workload:
    return mixer_workload() if name == "mixer" else get_workload(name)


def grid(hw, conv: bool) -> list[tt.Plan]:
    precisions = ["fp32", "bf16-mixed"] if hw.bf16 or hw.is_cuda else ["fp32"]
    layouts = [False, True] if conv else [False]
    return [tt.Plan(precision=p, compile=c, channels_last=cl)
            for p, c, cl in itertools.product(precisions, [False, True], layouts)]


@dataclass
class Row:
    name: str
    pooled: Trial         # every round's steady-state steps of this plan: its median and spread
    round_step_s: list[float] = field(default_factory=list)  # each round's median step
    paired: float = 1.0   # median over rounds of the naive plan's step over this plan's, same round

    @property
    def plan(self) -> tt.Plan:
        return self.pooled.plan

    @property
    def throughput(self) -> float:
        return self.pooled.samples_per_s

    @property
    def spread(self) -> float:
        return self.pooled.spread


def measure_plans(wl: Workload, plans: dict[str, tt.Plan], rounds: int) -> list[Row]:
    model, _ = wl.build(0)
    batches = [b for _, b in zip(range(4), wl.loader())]
    first = run_trial(model, wl.optimizer_fn, wl.loss_fn, batches, tt.Plan(), steps=5, warmup=2)
    steps = int(min(60, max(10, 2.0 / first.step_s)))
    rows = {name: Row(name, Trial(plan, first.samples_per_step)) for name, plan in plans.items()}
    naive = next(row for row in rows.values() if row.plan == tt.Plan())
    order = [naive, *(row for row in rows.values() if row is not naive)]
    for _ in range(rounds):
        for row in order:
            trial = run_trial(model, wl.optimizer_fn, wl.loss_fn, batches, row.plan, steps=steps, warmup=3)
            if not trial.ok:
                raise RuntimeError(f"{wl.name}: {row.name} failed: {trial.error}")
            row.pooled.step_times_s.extend(trial.step_times_s)
            row.round_step_s.append(trial.step_s)
    for row in order:
        row.paired = statistics.median(n / s for n, s in zip(naive.round_step_s, row.round_step_s))
    return order


def run(name: str, budget: float, rounds: int) -> dict:
    wl = workload(name)
    hw = detect()
    model, _ = wl.build(0)
    started = time.monotonic()
    # The tuner's own table goes to stderr, the comparison to stdout.
    result = tune_report(model, wl.loss_fn, wl.loader(), wl.optimizer_fn, budget, cache=False,
                         console=Console(stderr=True, width=150))
    tune_s = time.monotonic() - started
    conv = any(isinstance(m, nn.Conv2d) for m in model.modules())
    tuned_plan = result.plan.replace(num_workers=None, persistent_workers=None, pin_memory=None)
    grid_plans = {f"grid: {plan.describe()}": plan for plan in grid(hw, conv)}
    # A tuned plan that is one of the grid's is that row, not a second measurement of it: the
    # question is whether the tuner chose well, not whether one plan measures alike twice.
    same = next((label for label, plan in grid_plans.items() if plan.changes() == tuned_plan.changes()), None)
    plans = dict(grid_plans) if same else {"tuned": tuned_plan, **grid_plans}
    rows = measure_plans(wl, plans, rounds)
    grid_rows = [r for r in rows if r.name != "tuned"]
    naive = next(r for r in grid_rows if r.plan == tt.Plan())
    best = max(grid_rows, key=lambda r: r.paired)
    tuned = next(r for r in rows if r.name == (same or "tuned"))
    return {"workload": name, "unit": wl.unit, "units": wl.units_per_sample, "rows": rows, "naive": naive,
            "best": best, "tuned": tuned, "tune_s": tune_s, "budget": budget, "tuned_plan": result.plan,
            "search_speedup": result.speedup}


def print_report(results: list[dict], markdown: bool) -> None:
    hw = detect()
    header = f"{hw.summary()}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    if markdown:
        print(f"Machine: {header}.\n")
        print("| workload | plan | throughput | vs naive (paired) | pooled | spread |")
        print("| --- | --- | ---: | ---: | ---: | ---: |")
    else:
        print(header)
    for res in results:
        for row in sorted(res["rows"], key=lambda r: -r.paired):
            label = f"tuned: {row.plan.describe()}" if row.name == "tuned" else row.name
            if row is res["tuned"] and row.name != "tuned":
                label = f"{label} (= tuned)"
            tput = f"{row.throughput * res['units']:,.0f} {res['unit']}/s"
            ratio, pooled = f"{row.paired:.2f}x", f"{row.throughput / res['naive'].throughput:.2f}x"
            if markdown:
                print(f"| {res['workload']} | {label} | {tput} | {ratio} | {pooled} | {row.spread:.0%} |")
            else:
                print(f"  {res['workload']:6s} {label:60s} {tput:>18s} {ratio:>7s}  pooled {pooled:>6s}  "
                      f"spread {row.spread:.0%}")
    print()
    if markdown:
        print("| workload | tuned / grid best | tuned / naive | pooled: tuned / grid best | tuning time (budget) |")
        print("| --- | ---: | ---: | ---: | ---: |")
    for res in results:
        vs_best = res["tuned"].paired / res["best"].paired
        vs_naive = res["tuned"].paired
        pooled_best = max(r.throughput for r in res["rows"] if r.name != "tuned")
        pooled = res["tuned"].throughput / pooled_best
        if markdown:
            print(f"| {res['workload']} | {vs_best:.2f}x (best: {res['best'].plan.describe()}) | {vs_naive:.2f}x "
                  f"| {pooled:.2f}x | {res['tune_s']:.0f} s ({res['budget']:.0f} s) |")
        else:
            print(f"{res['workload']}: tuned {vs_best:.2f}x the grid's best ({res['best'].plan.describe()}), "
                  f"{vs_naive:.2f}x naive (paired; pooled {pooled:.2f}x the grid's best); tuning took "
                  f"{res['tune_s']:.0f}s of {res['budget']:.0f}s (its own estimate: {res['search_speedup']:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="gpt,cnn,mixer")
    parser.add_argument("--budget", type=float, default=120.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's own choice, the cores)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for name in args.workloads.split(","):
        res = run(name.strip(), args.budget, args.rounds)
        print(f"{name}: tuned in {res['tune_s']:.0f}s -> {res['tuned_plan'].describe()}", flush=True)
        results.append(res)
    print_report(results, args.markdown)


if __name__ == "__main__":
    main()
