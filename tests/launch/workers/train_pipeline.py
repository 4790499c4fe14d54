"""A pipeline training script run by `turbotrain launch` in the tests (tests/launch/pipeline_tiny.py's set-up).

Each rank writes OUT/<config>-rank<r>.pt: the weights of its own stages (original names), the logged history,
and what it held.
"""

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/launch: pipeline_tiny.py

import pipeline_tiny as tiny  # noqa: E402
import turbotrain as tt  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--config", action="append", required=True, choices=sorted(tiny.CONFIGS))
parser.add_argument("--steps", type=int, default=tiny.STEPS)
parser.add_argument("--meta", action="store_true", help="build the model on the meta device")
parser.add_argument("--clip", type=float, default=None)
parser.add_argument("--checkpoint-dir", default=None)
parser.add_argument("--validate", action="store_true")
args = parser.parse_args()

rank = int(os.environ["RANK"])
torch.use_deterministic_algorithms(True)

for config in args.config:
    settings, split_points = tiny.CONFIGS[config]
    if args.meta:
        with torch.device("meta"):
            model = tiny.Net()
    else:
        model = tiny.make_model()
    optimizer = tiny.make_optimizer(model)
    ckpt_dir = args.checkpoint_dir and os.path.join(args.checkpoint_dir, config)
    trainer = tt.Trainer(model, optimizer, tiny.loss_fn, plan=tt.Plan(strategy="pipeline", **settings),
                         split_points=split_points, max_steps=args.steps, log_every_n_steps=1, progress=False,
                         warmup_steps=0, gradient_clip_val=args.clip, checkpoint_dir=ckpt_dir,
                         checkpoint_every_n_steps=5 if ckpt_dir else None,
                         val_check_interval=10 if args.validate else None)
    result = trainer.fit(tiny.loader(), tiny.loader(n=32) if args.validate else None, resume=ckpt_dir is not None)
    weights = {name.partition(".")[2]: t.detach().clone() for name, t in trainer.model.state_dict().items()}
    opt_bytes = sum(t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
                    if torch.is_tensor(t) and t.dim())
    params = [p for g in optimizer.param_groups for p in g["params"]]
    torch.save({
        "weights": weights,
        "history": result.history,
        "steps": result.steps,
        "stopped_by": result.stopped_by,
        "param_bytes": sum(p.numel() * p.element_size() for p in params),
        "grad_bytes": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
        "optimizer_bytes": opt_bytes,
        "optimizer_class": type(optimizer).__name__,
        "lr": optimizer.param_groups[0]["lr"],
        "meta_left": sorted(n for n, p in model.named_parameters() if p.is_meta),
    }, os.path.join(args.out, f"{config}-rank{rank}.pt"))
