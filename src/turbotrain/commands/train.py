"""``turbotrain train recipe.yaml``: train a reference workload from a recipe."""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument("recipe", help="recipe YAML (workload, plan, training_hyperparams, trainer)")
    parser.add_argument("--print-plan", action="store_true", help="print the resolved plan as YAML and exit")


def run(args) -> int:
    from rich.console import Console

    from ..bench.workloads import get_workload
    from ..config import ConfigError, to_mapping
    from ..recipe import load_recipe
    from ..train.checkpoint import CheckpointError
    from ..train.trainer import Trainer

    recipe = load_recipe(args.recipe)
    wl = get_workload(recipe.workload, recipe.scale)
    model, optimizer = wl.build(recipe.seed)
    if recipe.lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr
    plan = recipe.resolved_plan(model)
    console = Console()
    if args.print_plan:
        print(plan.to_yaml(), end="")
        return 0
    console.print(f"[bold]{recipe.workload}[/] with plan: {plan.describe()}")
    trainer = Trainer(model, optimizer, wl.loss_fn, plan=plan, **to_mapping(recipe.trainer))
    try:
        result = trainer.fit(wl.loader(recipe.batch_size, seed=recipe.seed), resume=recipe.resume)
    except CheckpointError as exc:
        if isinstance(exc, ConfigError):  # a checkpoint that does not fit this recipe: main() says so, exit 2
            raise
        print(f"turbotrain: {exc}", file=sys.stderr)  # damaged or refused checkpoints, each file named
        return 1
    console.print(
        f"stopped by {result.stopped_by} after {result.steps} steps: "
        f"{result.samples_per_s * wl.units_per_sample:,.0f} {wl.unit}/s, "
        + ", ".join(f"{k}={v:.4g}" for k, v in result.metrics.items() if k.endswith("loss"))
    )
    for switch, why in result.skipped:
        console.print(f"skipped {switch}: {why}")
    return 0
