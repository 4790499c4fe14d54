"""``turbotrain demo``: doctor -> tune -> train on the reference workloads.

Each workload's plain loop is diagnosed first (``tt.doctor.watch``: the bottleneck and what the
findings say the fixes buy), then, with a tuning budget, ``tt.tune`` measures the fastest plan;
then the workload is trained with the naive plan, the fast plan (by rule) and the tuned plan.
"""

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
    throughput: float  # units (tokens, images) per second, steady state
    first_loss: float  # mean training loss over the first logging window
    final_loss: float  # mean training loss over the last logging window
    skipped: list[tuple[str, str]]


def _diagnose(workload: str, seed: int, steps: int, console: Console) -> None:
    """A plain PyTorch loop over the workload under the doctor; its bottleneck and top findings."""
    from .doctor import watch  # only the demo's first stage needs the doctor

    wl = get_workload(workload)
    model, optimizer = wl.build(seed)
    with watch(steps=steps, warmup=2, what_if_budget_s=15, print_report=False) as doctor:
        for _ in range(100):  # epochs; the doctor ends the block once it has measured its steps
            for inputs, targets in wl.loader(seed=seed):
                loss = wl.loss_fn(model(inputs), targets)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    report = doctor.report
    if report is None:  # never: the block ends with a report (an exception from it is re-raised)
        raise RuntimeError("the doctor made no report")
    took = (
        f"takes {report.breakdown.median_s * 1e3:.1f} ms a step"  # type: ignore[union-attr]  # set with a bottleneck
        if report.bottleneck
        else "was not measured"
    )
    console.print(f"  {workload:4s} doctor: a plain loop {took}; bottleneck: {report.bottleneck}")
    # What the doctor found to buy something, biggest first (a what-if that measured slower is the tuner's to skip).
    ranked = sorted((f for f in report.findings if (f.est_speedup or 1.0) > 1.0), key=lambda f: -(f.est_speedup or 1.0))
    for finding in ranked[:3]:
        console.print(
            f"       {finding.severity:6s} {finding.rule} (x{finding.est_speedup:.2f}"
            f"{', measured' if finding.measured else ', estimated'})"
            f"{' -> speed-up ' + repr(finding.speedup) if finding.speedup else ''}"
        )
    if not ranked:
        console.print("       no fix measured or estimated to pay here")


def _tuned_plan(workload: str, seed: int, budget_s: float, console: Console) -> tuple[Plan, str]:
    """The plan ``tt.tune`` measures fastest on this workload (its table printed), and a one-line verdict."""
    from .tuning.api import tune_report  # the tuner is only needed when the demo tunes

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
    trainer = Trainer(
        model,
        optimizer,
        wl.loss_fn,
        plan=plan,
        max_steps=steps,
        warmup_steps=min(5, steps - 1),
        log_every_n_steps=window,
        progress=False,
    )
    result = trainer.fit(wl.loader(seed=seed))
    losses = [row["train_loss"] for row in result.history if "train_loss" in row]
    return DemoRow(
        workload,
        plan_name,
        plan,
        wl.unit,
        result.samples_per_s * wl.units_per_sample,
        losses[0],
        losses[-1],
        result.skipped,
    )


def run_demo(
    workloads: tuple[str, ...] = ("gpt", "cnn"),
    steps: int = 60,
    seed: int = 0,
    console: Console | None = None,
    tune_budget_s: float = 0.0,
    diagnose: bool = False,
) -> list[DemoRow]:
    """Train each workload with the naive and the fast plan and, with ``tune_budget_s > 0``,
    with the plan ``tt.tune`` finds in that many seconds; print one table of all runs.
    ``diagnose=True`` runs the doctor on a plain loop of each workload first."""
    console = console or Console()
    hw = detect()
    console.print(f"[bold]turbotrain demo[/] on {hw.summary()}, torch {torch.__version__}")
    rows: list[DemoRow] = []
    for name in workloads:
        if diagnose:
            with console.status(f"diagnosing a plain {name} loop..."):
                _diagnose(name, seed, 10, console)
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
            console.print(
                f"  {name:4s} {plan_name:5s} {row.throughput:12,.0f} {row.unit}/s   plan: {row.plan.describe()}"
            )
            for switch, why in row.skipped:
                console.print(f"       skipped {switch}: {why}")
    names = " vs ".join(dict.fromkeys(row.plan_name for row in rows))
    table = Table(title=f"{names} plan, {steps} steps each (throughput after warm-up)")
    for col in ("workload", "plan", "throughput", "speed-up", "loss first -> last window"):
        table.add_column(col, justify="right" if col != "workload" else "left")
    base: dict[str, float] = {}
    for row in rows:
        base.setdefault(row.workload, row.throughput)
        table.add_row(
            row.workload,
            row.plan_name,
            f"{row.throughput:,.0f} {row.unit}/s",
            f"{row.throughput / base[row.workload]:.2f}x",
            f"{row.first_loss:.3f} -> {row.final_loss:.3f}",
        )
    console.print(table)
    return rows
