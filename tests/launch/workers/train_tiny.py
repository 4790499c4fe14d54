"""A training script run by `turbotrain launch` in the tests: trains tests/launch/launch_tiny.py's set-up.

Each rank writes OUT/<config>-rank<r>.pt with its final full weights and what it observed.

Several runs in one launch (each process starts torch once): their options separated by ``--next-run``, each with
its own ``--out``.
"""

import argparse
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/launch: launch_tiny.py

import launch_tiny as tiny
import several_runs
import turbotrain as tt
from turbotrain.launch.fsdp import full_state_dict

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--config", action="append", required=True, choices=tiny.CONFIGS)
parser.add_argument("--strategy", default="auto")
parser.add_argument("--checkpoint-dir", default=None)
parser.add_argument("--checkpoint-every", type=int, default=3)
parser.add_argument("--max-steps", type=int, default=tiny.MAX_STEPS)
parser.add_argument("--kill-rank", type=int, default=None)
parser.add_argument("--kill-at-step", type=int, default=None)

rank = int(os.environ["RANK"])
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))


def counting(fn, counter):
    """``fn``, counting its calls in ``counter[0]`` (bound here, not to the loop's variables)."""
    def counted(*a, **kw):
        counter[0] += 1
        return fn(*a, **kw)
    return counted


def counting_hook(counter):
    """A DDP comm hook that counts gradient synchronizations in ``counter[0]``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def hook(state, bucket):
        counter[0] += bucket.index() == 0  # one gradient synchronization (bucket 0 of however many)
        return default_hooks.allreduce_hook(state, bucket)
    return hook


class KillAt:
    """Kill this rank (SIGKILL, no clean-up) when the first attempt reaches a step."""

    def on_log(self, trainer, metrics):
        if restart == 0 and rank == args.kill_rank and metrics["step"] == args.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)


for args in several_runs.split(parser, sys.argv[1:]):  # rebinds the module's ``args``, which KillAt reads
    for config in args.config:
        model = tiny.make_model(config)
        optimizer, scheduler = tiny.make_optimizer(model)
        torch.manual_seed(100 + rank)  # per-rank random streams (dropout): a resume must restore each rank's own
        ckpt_dir = args.checkpoint_dir and os.path.join(args.checkpoint_dir, config)
        plan = tt.Plan(strategy=args.strategy, grad_accum_steps=tiny.ACCUM)
        trainer = tt.Trainer(model, optimizer, tiny.loss_fn, plan=plan, schedulers=scheduler, callbacks=[KillAt()],
                             **tiny.trainer_kwargs(max_steps=args.max_steps, checkpoint_dir=ckpt_dir,
                                                   checkpoint_every_n_steps=args.checkpoint_every if ckpt_dir else None,
                                                   log_dir=os.path.join(args.out, f"logs-{config}")))
        allreduces, reduce_scatters = [0], [0]
        original = None
        if args.strategy == "fsdp":  # FSDP2 reduce-scatters each shard unit's gradients through this function
            original = dist.reduce_scatter_single
            dist.reduce_scatter_single = counting(original, reduce_scatters)
        if trainer.rt.ddp is not None and hasattr(trainer.rt.ddp, "register_comm_hook"):
            trainer.rt.ddp.register_comm_hook(dist.group.WORLD, counting_hook(allreduces))
        model_params = {id(p) for p in trainer.model.parameters()}
        try:
            result = trainer.fit(tiny.train_loader(), tiny.val_loader(), resume=ckpt_dir is not None)
        finally:  # the next --config counts its own calls, through one wrapper
            if original is not None:
                dist.reduce_scatter_single = original
        torch.save({
            "weights": full_state_dict(trainer.model),
            "history": result.history,
            "steps": result.steps,
            "allreduces": allreduces[0],
            "reduce_scatters": reduce_scatters[0],
            "world": dist.get_world_size() if dist.is_initialized() else 1,
            "restart": restart,
            "applied": result.applied,
            "optimizer_on_model_params": all(id(p) in model_params
                                             for g in optimizer.param_groups for p in g["params"]),
            "lr": optimizer.param_groups[0]["lr"],
        }, os.path.join(args.out, f"{config}-rank{rank}.pt"))
