"""``turbotrain tune``: tune a recipe or a reference workload, and write the plan out.

turbotrain tune recipe.yaml --yaml plan.yaml
turbotrain tune --workload cnn --time-budget 120 --lightning - --accelerate accelerate.yaml
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("recipe", nargs="?", help="recipe YAML (workload, scale, seed, batch_size, lr, plan)")
    parser.add_argument(
        "--workload", choices=("gpt", "cnn", "mlp"), help="tune a reference workload instead of a recipe's"
    )
    parser.add_argument("--scale", choices=("cpu", "gpu"), help="workload size (default: the recipe's, else cpu)")
    parser.add_argument(
        "--time-budget",
        type=float,
        metavar="S",
        help="seconds tuning may take in all (default: derived from the naive plan's step time)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help="the run's length in optimizer steps, over which compile is priced (default: the recipe's max_steps)",
    )
    parser.add_argument("--yaml", metavar="PATH", help="write the plan as YAML ('-' for stdout)")
    parser.add_argument("--lightning", metavar="PATH", help="write the Lightning Trainer equivalent ('-' for stdout)")
    parser.add_argument("--accelerate", metavar="PATH", help="write an Accelerate config file ('-' for stdout)")
    parser.add_argument(
        "--batch-size",
        choices=("keep", "max", "keep-effective"),
        default="keep",
        help="keep the loader's batch (default), find the largest that fits ('max'), or the "
        "largest micro-batch with accumulation keeping the effective batch ('keep-effective')",
    )
    parser.add_argument("--no-workers", action="store_true", help="do not run the num_workers finder")
    parser.add_argument("--exclude", default="", metavar="NAMES", help="speed-ups not to try, e.g. compile,precision")
    parser.add_argument("--include", default="", metavar="NAMES", help="only try these speed-ups")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="numerics guard: largest relative loss departure from fp32 (default: 0.05)",
    )
    parser.add_argument("--no-cache", action="store_true", help="tune again even when a cached result exists")
    parser.add_argument(
        "--seed", type=int, default=None, help="model initialisation seed (default: the recipe's, else 0)"
    )


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _write(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
    else:
        Path(path).write_text(text)
        print(f"wrote {path}")


def _setup(args):
    """(workload, seed, batch_size, base plan) from a recipe and/or the flags."""
    from ..bench.workloads import get_workload
    from ..config import ConfigError
    from ..plan import Plan
    from ..recipe import load_recipe

    if not args.recipe and not args.workload:
        raise ConfigError("turbotrain tune: give a recipe YAML or --workload gpt|cnn|mlp.")
    recipe = load_recipe(args.recipe) if args.recipe else None
    name = args.workload or recipe.workload
    scale = args.scale or (recipe.scale if recipe else "cpu")
    wl = get_workload(name, scale)
    seed = args.seed if args.seed is not None else (recipe.seed if recipe else 0)
    base = Plan()
    if recipe is not None:
        if recipe.lr is not None:
            wl = dataclasses.replace(wl, lr=recipe.lr)
        if isinstance(recipe.plan, Plan):  # what the recipe fixes beyond speed: device, accumulation
            base = Plan(device=recipe.plan.device, grad_accum_steps=recipe.plan.grad_accum_steps)
    return wl, seed, (recipe.batch_size if recipe else None), base, (recipe.trainer.max_steps if recipe else None)


def run(args) -> int:
    from .api import tune_report
    from .export import accelerate_yaml, lightning_snippet, plan_yaml

    wl, seed, batch_size, base, recipe_steps = _setup(args)
    model, _ = wl.build(seed)
    options = {}
    if args.tolerance is not None:
        options["tolerance"] = args.tolerance
    result = tune_report(
        model,
        wl.loss_fn,
        wl.loader(batch_size, seed=seed),
        wl.optimizer_fn,
        args.time_budget,
        steps=args.steps or recipe_steps,
        plan=base,
        include=_names(args.include) or None,
        exclude=_names(args.exclude),
        find_batch_size=False if args.batch_size == "keep" else args.batch_size,
        find_num_workers=not args.no_workers,
        cache=not args.no_cache,
        **options,
    )
    plan = result.plan
    header = f"turbotrain tune, {wl.name} workload: {result.speedup:.2f}x the naive plan on {result.hardware}"
    if args.yaml:
        _write(args.yaml, plan_yaml(plan, header))
    if args.lightning:
        _write(args.lightning, lightning_snippet(plan))
    if args.accelerate:
        _write(args.accelerate, accelerate_yaml(plan))
    if not (args.yaml or args.lightning or args.accelerate):
        print(plan_yaml(plan, header), end="")
    return 0
