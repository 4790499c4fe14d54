"""Run by `turbotrain launch` in the tests: rank 1 alone sees a NaN loss at step 3 (its gradients stay
finite, so nothing spreads it to rank 0). Each rank writes OUT/rank<r>.txt with the step it stopped at.

Several runs in one launch (each process starts torch once): their options separated by ``--next-run``, each with
its own ``--out``."""

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/launch: launch_tiny.py

import launch_tiny as tiny
import several_runs
import turbotrain as tt

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--strategy", default="ddp")
rank = int(os.environ["RANK"])
calls = [0]


def loss_fn(outputs, targets):
    calls[0] += 1
    loss = tiny.loss_fn(outputs, targets)
    if rank == 1 and calls[0] == 3:
        loss = loss + torch.tensor(float("nan"))  # a constant: the gradients stay finite
    return loss


for args in several_runs.split(parser, sys.argv[1:]):
    calls[0] = 0
    model = tiny.make_model("plain")
    optimizer, _ = tiny.make_optimizer(model)
    trainer = tt.Trainer(model, optimizer, loss_fn, plan=tt.Plan(strategy=args.strategy),
                         **tiny.trainer_kwargs(max_steps=6))
    try:
        trainer.fit(tiny.train_loader())
        stopped = "finished"
    except tt.NonFiniteError as exc:
        stopped = str(exc.step)
    Path(args.out, f"rank{rank}.txt").write_text(stopped)
