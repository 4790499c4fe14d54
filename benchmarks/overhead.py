"""Framework overhead per step: turbotrain's Trainer (naive plan) against a hand-written loop.

A tiny MLP on in-memory batches (CPU, batch 32), so the framework's own per-step cost is what
shows. Every runner sees the same batches in the same order; the script prints the median
time per step over several repeats, the ratio to the plain loop measured in the same run,
and whether the final weights equal the plain loop's. Lightning and Accelerate are timed
too when they are installed.

The Trainer drops gradients with ``p.grad = None`` rather than ``optimizer.zero_grad()``
(same effect, without zero_grad's per-call profiler range: about 15 us of this step), which pays
for its own NaN guard and bookkeeping. The "plain, p.grad = None" row is a plain loop that
does the same, so the Trainer's own per-step cost can be read against it too.

Timing uses this thread's CPU time by default (``--clock cpu``, torch pinned to one thread):
on a shared machine, wall time mostly measures the neighbours; ``--clock wall`` is there for
quiet machines.

    python benchmarks/overhead.py [--steps 1000] [--repeats 9] [--clock cpu|wall]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import turbotrain as tt
from turbotrain.bench.models import TinyMLP


class Batches:
    """Pre-built in-memory batches: a plain iterable (Lightning reads a *list* as several loaders)."""

    def __init__(self, n: int, batch: int = 32):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n * batch, 32, generator=g)
        y = x[:, :10].argmax(1)
        self.items = [(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]) for i in range(n)]

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


clock = time.thread_time


def fresh(device="cpu"):
    torch.manual_seed(0)
    model = TinyMLP().to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def plain_steps(model, opt, data):
    """The hand-written loop every runner is read against (benchmarks/gpu_extras.py times it on a GPU)."""
    for x, y in data:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()


def plain_steps_dropping_grads(model, opt, data):
    """The plain loop dropping gradients itself, as the Trainer does: the like-for-like baseline."""
    params = list(model.parameters())
    for x, y in data:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        for p in params:
            p.grad = None


def plain(data):
    model, opt = fresh()
    start = clock()
    plain_steps(model, opt, data)
    return clock() - start, model


def plain_dropping_grads(data):
    model, opt = fresh()
    start = clock()
    plain_steps_dropping_grads(model, opt, data)
    return clock() - start, model


def turbotrain_trainer(data):
    model, opt = fresh()
    trainer = tt.Trainer(model, opt, F.cross_entropy, max_epochs=1, log_every_n_steps=len(data), progress=False)
    start = clock()
    trainer.fit(data)
    return clock() - start, model


def turbotrain_trainer_unguarded(data):
    """The Trainer without its per-step NaN/inf check (on_nonfinite='ignore'), as plain PyTorch."""
    model, opt = fresh()
    trainer = tt.Trainer(model, opt, F.cross_entropy, max_epochs=1, log_every_n_steps=len(data), progress=False,
                         on_nonfinite="ignore")
    start = clock()
    trainer.fit(data)
    return clock() - start, model


def turbotrain_setup(data):
    model, opt = fresh()
    model, opt, loader = tt.setup(model, opt, data)
    start = clock()
    for x, y in loader:
        opt.backward(F.cross_entropy(model(x), y))
        opt.step()
    return clock() - start, model.module


def lightning(data):
    import lightning as L

    model, opt = fresh()

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, _):
            x, y = batch
            return F.cross_entropy(self.model(x), y)

        def configure_optimizers(self):
            return opt

    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    start = clock()
    trainer.fit(Module(), train_dataloaders=data)
    return clock() - start, model


def accelerate(data):
    from accelerate import Accelerator

    model, opt = fresh()
    acc = Accelerator(cpu=True)
    model, opt = acc.prepare(model, opt)
    start = clock()
    for x, y in data:
        loss = F.cross_entropy(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    return clock() - start, acc.unwrap_model(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args()
    global clock
    if args.clock == "cpu":
        torch.set_num_threads(1)  # thread CPU time only sees this thread's work
    else:
        clock = time.perf_counter
    data = Batches(args.steps)
    runners = {"plain loop": plain, "plain, p.grad = None": plain_dropping_grads, "turbotrain Trainer": turbotrain_trainer,
               "Trainer, no NaN guard": turbotrain_trainer_unguarded, "turbotrain setup": turbotrain_setup}
    for name, fn, module in (("Lightning", lightning, "lightning"), ("Accelerate", accelerate, "accelerate")):
        try:
            __import__(module)
            runners[name] = fn
        except ImportError:
            print(f"{name} not installed: skipped")
    times: dict[str, list[float]] = {name: [] for name in runners}
    weights: dict[str, torch.nn.Module] = {}
    for _ in range(args.repeats):
        for name, fn in runners.items():  # interleaved, so drift in machine load hits every runner alike
            seconds, model = fn(data)
            times[name].append(seconds / args.steps)
            weights[name] = model
    # The minimum over repeats is the run least disturbed by other work (timeit's advice); the
    # median is printed beside it to show how noisy the machine was.
    ref = min(times["plain loop"])
    print(f"\n{args.steps} steps x {args.repeats} repeats, tiny MLP, batch 32, CPU ({os.cpu_count()} cores), "
          f"torch {torch.__version__}, {args.clock} time")
    ref_med = statistics.median(times["plain loop"])
    print(f"{'runner':22s} {'us/step min':>11s} {'vs plain':>9s} {'us/step median':>15s} {'vs plain':>9s}  "
          f"weights == plain loop")
    for name, ts in times.items():
        best, med = min(ts), statistics.median(ts)
        same = all(torch.equal(a, b) for a, b in zip(weights["plain loop"].parameters(), weights[name].parameters()))
        print(f"{name:22s} {best * 1e6:11.1f} {best / ref:8.2f}x {med * 1e6:15.1f} {med / ref_med:8.2f}x  {same}")


if __name__ == "__main__":
    main()
