"""``turbotrain demo``: the reference workloads trained with the naive plan, the fast plan (by rule)
and, when a tuning budget is given, the tuned plan (measured on the workload by ``tt.tune``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from .bench.workloads import get_workload
from .hardware import detect
from .plan import Plan
from .train.trainer import Trainer

__all__ = ["DemoRow", "run_demo"]


@dataclass
class DemoRow:
    workload: str
    plan_name: str
    plan: Plan
    unit: str
    throughput: float        # units (tokens, images) per second, steady state
    first_loss: float        # mean training loss over the first logging window
    final_loss: float        # mean training loss over the last logging window
    skipped: list[tuple[str, str]]


def _tuned_plan(workload: str, seed: int, budget_s: float, console: Console) -> tuple[Plan, str]:
    """The plan ``tt.tune`` measures fastest on this workload (its table printed), and a one-line verdict."""
    from .tune.api import tune_report  # the tuner is only needed when the demo tunes

    wl = get_workload(workload)
    model, _ = wl.build(seed)
    result = tune_report(model, wl.loss_fn, wl.loader(seed=seed), wl.optimizer_fn, budget_s, console=console)
    how = "from the cache" if result.from_cache else f"in {result.elapsed_s:.0f}s"
    return result.plan, f"tuned {how}, {result.speedup:.2f}x naive in its own trials"


def _train(workload: str, plan_name: str, steps: int, seed: int, plan: Plan | None = None) -> DemoRow:
    wl = get_workload(workload)
    model, optimizer = wl.build(seed)
    if plan is None:
        plan = Plan.fast(model) if plan_name == "fast" else Plan()
    window = max(1, steps // 5)
    trainer = Trainer(model, optimizer, wl.loss_fn, plan=plan, max_steps=steps, warmup_steps=min(5, steps - 1),
                      log_every_n_steps=window, progress=False)
    result = trainer.fit(wl.loader(seed=seed))
    losses = [row["train_loss"] for row in result.history if "train_loss" in row]
    return DemoRow(workload, plan_name, plan, wl.unit, result.samples_per_s * wl.units_per_sample,
                   losses[0], losses[-1], result.skipped)


def run_demo(workloads: tuple[str, ...] = ("gpt", "cnn"), steps: int = 60, seed: int = 0,
             console: Console | None = None, tune_budget_s: float = 0.0) -> list[DemoRow]:
    """Train each workload with the naive and the fast plan and, with ``tune_budget_s > 0``,
    with the plan ``tt.tune`` finds in that many seconds; print one table of all runs."""
    console = console or Console()
    hw = detect()
    console.print(f"[bold]turbotrain demo[/] on {hw.summary()}, torch {torch.__version__}")
    rows: list[DemoRow] = []
    for name in workloads:
        plans: list[tuple[str, Plan | None]] = [("naive", None), ("fast", None)]
        if tune_budget_s > 0:
            console.print(f"[bold]tuning {name}[/] (budget {tune_budget_s:.0f}s)")
            tuned, verdict = _tuned_plan(name, seed, tune_budget_s, console)
            console.print(f"  {name:4s} {verdict}")
            plans.append(("tuned", tuned))
        for plan_name, plan in plans:
            with console.status(f"training {name} with the {plan_name} plan ({steps} steps)..."):
                row = _train(name, plan_name, steps, seed, plan)
            rows.append(row)
            console.print(f"  {name:4s} {plan_name:5s} {row.throughput:12,.0f} {row.unit}/s   plan: {row.plan.describe()}")
            for switch, why in row.skipped:
                console.print(f"       skipped {switch}: {why}")
    names = " vs ".join(dict.fromkeys(row.plan_name for row in rows))
    table = Table(title=f"{names} plan, {steps} steps each (throughput after warm-up)")
    for col in ("workload", "plan", "throughput", "speed-up", "loss first -> last window"):
        table.add_column(col, justify="right" if col != "workload" else "left")
    base: dict[str, float] = {}
    for row in rows:
        base.setdefault(row.workload, row.throughput)
        table.add_row(row.workload, row.plan_name, f"{row.throughput:,.0f} {row.unit}/s",
                      f"{row.throughput / base[row.workload]:.2f}x", f"{row.first_loss:.3f} -> {row.final_loss:.3f}")
    console.print(table)
    return rows
