"""What the doctor's instrumentation costs: step time under the doctor's recorder / uninstrumented.

For each reference workload (mlp: tiny steps where any per-step cost shows most; cnn; gpt) the
same training loop runs uninstrumented and under the doctor's recorder (every hook of a
measured step: phases, syncs, copies, the line sampler; no profiler window), alternating, in
the same process. The uninstrumented loop is timed by one global optimizer post-hook that only
reads the clock. Other processes only ever add time to a step, so each round's number is the
lower quartile of its step times (the median is printed too); the ratio is doctor / plain per
round, printed as the median over rounds and its spread (min..max). Target: <= 1.05.

``--compile``: each model ``torch.compile``d first (compiled once, in the warm-up both loops share), so the
doctor's cost is measured on a compiled script, its compile watch on.

``--compile-time``: the compiling itself, which happens in the doctor's warm-up: the first step of a fresh
``torch.compile`` (nothing compiled in memory, Inductor's graph caches off) plain and under the recorder, alternated
(the order swapped each round: the compiled C++ kernels stay cached on disk for the second), ratio doctor / plain.

    python benchmarks/doctor_overhead.py [--rounds 7] [--steps 30] [--workloads mlp,cnn,gpt] [--threads 1]
                                         [--compile | --compile-time]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

from turbotrain.bench.workloads import get_workload  # noqa: E402
from turbotrain.doctor.record.recorder import Recorder  # noqa: E402
from turbotrain.hardware import detect  # noqa: E402


def train(workload, model, opt, batches, steps: int) -> None:
    for i in range(steps):
        x, y = batches[i % len(batches)]
        loss = workload.loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def plain_steps(workload, model, opt, batches, steps: int) -> list[float]:
    stamps: list[float] = []
    handle = register_optimizer_step_post_hook(lambda *_: stamps.append(time.perf_counter()))
    try:
        train(workload, model, opt, batches, steps)
    finally:
        handle.remove()
    return [b - a for a, b in zip(stamps, stamps[1:])][2:]  # same warm-up as the doctor's


def doctor_steps(workload, model, opt, batches, steps: int) -> list[float]:
    recorder = Recorder(measure=steps, warmup=3, profile=0, stop=False)
    with recorder:
        train(workload, model, opt, batches, steps + 3)
    return [s.duration for s in recorder.steps[3:]]


def first_compiled_step_s(workload, model, opt, batches, under_doctor: bool) -> float:
    """Seconds of the first step of a fresh torch.compile of ``model``, plain or under the doctor's recorder."""
    import torch._dynamo
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    compiled = torch.compile(model)
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        started = time.perf_counter()
        if under_doctor:
            with Recorder(measure=1, warmup=3, profile=0, stop=False):
                train(workload, compiled, opt, batches, 1)
        else:
            train(workload, compiled, opt, batches, 1)
        return time.perf_counter() - started


def compile_times(workload_names: str, rounds: int) -> None:
    heads = ("plain first step s", "doctor first step s", "ratio (median)", "spread")
    print(f"{'workload':8} {heads[0]:>19} {heads[1]:>20} {heads[2]:>15} {heads[3]:>14}")
    for name in workload_names.split(","):
        workload = get_workload(name)
        model, opt = workload.build()
        batches = [b for _, b in zip(range(2), workload.loader())]
        first_compiled_step_s(workload, model, opt, batches, False)  # compiles the C++ kernels both reuse
        plain, doctor, ratios = [], [], []
        for r in range(rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            seconds = {side: first_compiled_step_s(workload, model, opt, batches, side) for side in order}
            plain.append(seconds[False])
            doctor.append(seconds[True])
            ratios.append(seconds[True] / seconds[False])
        print(f"{name:8} {min(plain):19.2f} {min(doctor):20.2f} {statistics.median(ratios):15.3f} "
              f"{min(ratios):6.3f}..{max(ratios):<6.3f}", flush=True)


def lower_quartile(values: list[float]) -> float:
    return statistics.quantiles(values, n=4)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--workloads", default="mlp,cnn,gpt")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a shared box)")
    parser.add_argument("--compile", action="store_true", help="torch.compile each model first (Inductor)")
    parser.add_argument("--compile-time", action="store_true", help="time a fresh compile, plain and under the doctor")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hw = detect("cpu")
    print(f"machine: {hw.summary()}; torch {torch.__version__}; python {platform.python_version()}; "
          f"threads {args.threads}{'; compiled' if args.compile else ''}")
    if args.compile_time:
        compile_times(args.workloads, args.rounds)
        return 0
    print(f"{'workload':8} {'plain ms/step':>14} {'doctor ms/step':>15} {'ratio (median)':>15} {'spread':>14}")
    print(f"{'':8} {'(lower quartile of all steps)':>30}")
    worst = 0.0
    for name in args.workloads.split(","):
        workload = get_workload(name)
        model, opt = workload.build()
        if args.compile:
            model = torch.compile(model)
        loader = workload.loader()
        batches = [b for _, b in zip(range(8), loader)]
        started = time.perf_counter()
        train(workload, model, opt, batches, 5)  # first-touch costs (and compiling) out of the way
        if args.compile:
            print(f"  {name}: compiled in the first steps, {time.perf_counter() - started:.1f} s", flush=True)
        plain_all, doctor_all, ratios = [], [], []
        for _ in range(args.rounds):
            p = plain_steps(workload, model, opt, batches, args.steps + 3)
            d = doctor_steps(workload, model, opt, batches, args.steps)
            plain_all += p
            doctor_all += d
            ratios.append(lower_quartile(d) / lower_quartile(p))
        ratio = statistics.median(ratios)
        worst = max(worst, ratio)
        print(f"{name:8} {lower_quartile(plain_all) * 1e3:14.3f} {lower_quartile(doctor_all) * 1e3:15.3f} "
              f"{ratio:15.3f} {min(ratios):6.3f}..{max(ratios):<6.3f}   "
              f"(medians {statistics.median(plain_all) * 1e3:.3f} / {statistics.median(doctor_all) * 1e3:.3f} ms)")
    print(f"worst median ratio: {worst:.3f} (target <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
