"""A pipeline training script run by `turbotrain launch` in the tests (tests/launch/pipeline_tiny.py's set-up).

Each rank writes OUT/<config>-rank<r>.pt: the weights of its own stages (original names), the logged history,
and what it held (parameter, gradient and optimizer-state bytes).

Several runs in one launch (each process starts torch once): their options separated by ``--next-run``, each with
its own ``--out``; each rank logs ``run OUT begins`` and ``run OUT ends`` around each run, so what a run logged can
be told from the others'.
"""

import argparse
import logging
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/launch: pipeline_tiny.py

import pipeline_tiny as tiny
import several_runs
import turbotrain as tt

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--config", action="append", required=True, choices=sorted(tiny.CONFIGS))
parser.add_argument("--steps", type=int, default=tiny.STEPS)
parser.add_argument("--meta", action="store_true", help="build the model on the meta device")
parser.add_argument("--balanced", action="store_true", help="a model of identical blocks only (equal stages)")
parser.add_argument("--clip", type=float, default=None)
parser.add_argument("--checkpoint-dir", default=None)
parser.add_argument("--stop-at", type=int, default=None, help="train to this step, then resume in a new Trainer")
parser.add_argument("--validate", action="store_true")
parser.add_argument("--early-stop", action="store_true")
parser.add_argument("--nan-at-step", type=int, default=None)
parser.add_argument("--batch", type=int, default=tiny.BATCH)
parser.add_argument("--val-batch", type=int, default=tiny.BATCH)
parser.add_argument("--precision", default="fp32")
parser.add_argument("--meta-buffer", action="store_true", help="a buffer on the meta device in the last stage")

rank = int(os.environ["RANK"])
torch.use_deterministic_algorithms(True)
logging.basicConfig(level=logging.INFO, format=f"rank {rank}: %(message)s")  # turbotrain's log on stderr
log = logging.getLogger("train_pipeline")


def build():
    factory = tiny.Stack if args.balanced else tiny.Net
    if args.meta:
        with torch.device("meta"):
            model = factory()
            if args.meta_buffer:
                model.register_buffer("scale", torch.ones(4))
            return model
    torch.manual_seed(tiny.SEED)
    return factory()


logged = [0]  # the last step logged (every step is): the loss being computed belongs to the next one


class StepSeen:
    def on_log(self, trainer, metrics):
        logged[0] = metrics["step"]


def loss_fn(out, y):
    loss = (tiny.stack_loss if args.balanced else tiny.loss_fn)(out, y)
    if args.nan_at_step is not None and logged[0] + 1 == args.nan_at_step and torch.is_grad_enabled():
        loss = loss * float("nan")
    return loss


def train(config, max_steps, resume):
    settings, split_points = tiny.CONFIGS[config]
    model = build()
    optimizer = tiny.make_optimizer(model)
    grad_bytes = [0]

    def count_grads(opt, *_):
        grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                 for g in opt.param_groups for p in g["params"] if p.grad is not None]
        grad_bytes[0] = max(grad_bytes[0], sum(g.numel() * g.element_size() for g in grads))

    optimizer.register_step_pre_hook(count_grads)
    ckpt_dir = args.checkpoint_dir and os.path.join(args.checkpoint_dir, config)
    trainer = tt.Trainer(
        model, optimizer, loss_fn, plan=tt.Plan(strategy="pipeline", precision=args.precision, **settings),
        split_points=split_points,
        max_steps=max_steps, log_every_n_steps=1, progress=False, warmup_steps=0, gradient_clip_val=args.clip,
        checkpoint_dir=ckpt_dir, checkpoint_every_n_steps=5 if ckpt_dir else None,
        val_check_interval=5 if args.validate else None, on_nonfinite="skip" if args.nan_at_step else "stop",
        early_stopping=tt.EarlyStopping(patience=0, min_delta=1e9) if args.early_stop else None,
        callbacks=[StepSeen()])
    val = tiny.loader(batch=args.val_batch, n=32) if args.validate else None
    result = trainer.fit(tiny.loader(batch=args.batch), val, resume=resume)
    return trainer, model, optimizer, result, grad_bytes[0]


# Rebinds the module's ``args``, which build(), loss_fn and train() read.
for args in several_runs.split(parser, sys.argv[1:]):
    logged[0] = 0
    log.info("run %s begins", args.out)
    for config in args.config:
        if args.stop_at:
            train(config, args.stop_at, resume=False)  # checkpoints along the way, then a fresh Trainer resumes
        trainer, model, optimizer, result, grad_bytes = train(config, args.steps, resume=bool(args.stop_at))
        # under pipeline x FSDP the stages hold shards: gather each stage's (a collective among its replicas)
        weights = {name.partition(".")[2]: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()
                   for name, t in trainer.model.state_dict().items()}
        params = [p.to_local() if hasattr(p, "to_local") else p for g in optimizer.param_groups for p in g["params"]]
        torch.save({
            "weights": weights,
            "history": result.history,
            "steps": result.steps,
            "stopped_by": result.stopped_by,
            "skipped_steps": result.skipped_steps,
            "param_bytes": sum(p.numel() * p.element_size() for p in params),
            "grad_bytes": grad_bytes,
            "optimizer_bytes": sum(t.numel() * t.element_size() for state in optimizer.state.values()
                                   for t in state.values() if torch.is_tensor(t)),
            "stage_param_bytes": sum(t.numel() * t.element_size() for t in weights.values()),
            "whole_param_bytes": sum(p.numel() * p.element_size() for p in build().parameters()),
            "optimizer_class": type(optimizer).__name__,
            "optimizer_defaults": dict(optimizer.defaults),
            "real_params": sorted(n for n, p in model.named_parameters() if not p.is_meta),
        }, os.path.join(args.out, f"{config}-rank{rank}.pt"))
    log.info("run %s ends", args.out)
