"""``tt.tune``: the fastest safe Plan for this model on this machine, measured on the user's own data.

    plan = tt.tune(model, loss_fn, loader, optimizer_fn, steps=5000)   # budget: derived from the first trials
    tt.Trainer(model, optimizer_fn(model.parameters()), loss_fn, plan=plan).fit(loader)

Everything is timed on deep copies (``measure.run_trial``); the model, any optimizer built on
it, every RNG (Python, NumPy, torch, the loader's generators) and the backend flags are
exactly as they were when ``tune`` returns, so tuning does not change the training after it.
"""

from __future__ import annotations

import dataclasses
import itertools
import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal

from rich.console import Console
from torch import nn
from torch.utils.data import DataLoader

from ..data.loader import rebuild_loader
from ..data.transfer import batch_size_of
from ..hardware import detect
from ..measure import Trial, preserved_state, run_trial
from ..plan import Plan
from ..speedups.cpu_threads import fit_plan
from ..speedups.model_info import inspect_model
from ..train import rng
from . import cache as tune_cache
from . import batch_size as batch_finder
from .batch_size import BatchSizeResult
from .candidates import build_candidates
from .guard import DEFAULT_TOLERANCE
from .report import render
from .search import MIN_GAIN, Attempt, Measure, SearchResult, TuneError, search_plan
from . import workers as workers_finder
from .workers import WorkersResult

__all__ = ["tune", "tune_report", "TuneResult", "TuneError"]

log = logging.getLogger("turbotrain")

BatchSizeMode = Literal[False, True, "max", "keep-effective"]
_CACHE_VERSION = 2  # 2: the search starts from the rules' plan; rows say when compile pays
_FINDERS_S = 30.0  # with a derived budget, what the finders get after the search


@dataclass
class TuneResult:
    """The chosen plan and everything that led to it (``render`` prints it as a table)."""

    plan: Plan
    search: SearchResult
    hardware: str
    budget_s: float
    elapsed_s: float
    by_rule: dict[str, Any]
    workers: WorkersResult | None = None
    batch_size: BatchSizeResult | None = None
    from_cache: bool = False
    cache_path: str | None = None

    @property
    def speedup(self) -> float:
        return self.search.speedup

    def to_dict(self) -> dict[str, Any]:
        search = {
            **{f.name: getattr(self.search, f.name) for f in dataclasses.fields(self.search)},
            "plan": self.search.plan.to_dict(),
            "baseline": self.search.baseline.to_dict(),
            "attempts": [a.to_dict() for a in self.search.attempts],
        }
        return {
            "plan": self.plan.to_dict(),
            "search": search,
            "hardware": self.hardware,
            "budget_s": self.budget_s,
            "elapsed_s": self.elapsed_s,
            "by_rule": self.by_rule,
            "workers": self.workers.to_dict() if self.workers else None,
            "batch_size": self.batch_size.to_dict() if self.batch_size else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TuneResult":
        s = dict(data["search"])
        s.update(
            plan=Plan.from_dict(s["plan"]),
            baseline=Plan.from_dict(s["baseline"]),
            attempts=[Attempt.from_dict(a) for a in s["attempts"]],
            left_out=[tuple(x) for x in s["left_out"]],
        )
        workers = batch = None
        if data.get("workers"):
            workers = WorkersResult(**{**data["workers"], "tried": [tuple(x) for x in data["workers"]["tried"]]})
        if data.get("batch_size"):
            batch = BatchSizeResult(**{**data["batch_size"], "tried": [tuple(x) for x in data["batch_size"]["tried"]]})
        return cls(
            plan=Plan.from_dict(data["plan"]),
            search=SearchResult(**s),
            hardware=data["hardware"],
            budget_s=data["budget_s"],
            elapsed_s=data["elapsed_s"],
            by_rule=data["by_rule"],
            workers=workers,
            batch_size=batch,
        )


def _sample_batches(loader: Iterable, count: int) -> list[Any]:
    batches = list(itertools.islice(iter(loader), count))
    if not batches:
        raise TuneError("the loader yielded no batch to tune on")
    return batches


def _status_measure(measure: Measure, console: Console | None, deadline: float | None) -> Measure:
    """``measure`` that shows which plan is being timed and how much of the budget is left."""
    if console is None:
        return measure

    gives_up = "give_up_s" in inspect.signature(measure).parameters

    def shown(plan: Plan, steps: int, warmup: int, give_up_s: float | None = None) -> Trial:
        # One line per trial, no live spinner: a refresh thread competes with the timed steps
        # for the cores (on 2 cores that alone slows OpenMP kernels measurably).
        left = f" ({max(0.0, deadline - time.monotonic()):.0f}s of the budget left)" if deadline is not None else ""
        console.print(f"[dim]tuning: timing {plan.describe()}{left}[/]")
        if gives_up and give_up_s is not None:
            return measure(plan, steps, warmup, give_up_s=give_up_s)
        return measure(plan, steps, warmup)

    return shown


def tune_report(
    model: nn.Module,
    loss_fn: Callable | None,
    loader: Iterable,
    optimizer_fn: Callable,
    time_budget_s: float | None = None,
    *,
    steps: int | None = None,
    plan: Plan | None = None,
    step_fn: Callable | None = None,
    batches: int = 4,
    tolerance: float = DEFAULT_TOLERANCE,
    min_gain: float = MIN_GAIN,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
    find_batch_size: BatchSizeMode = False,
    find_num_workers: bool = True,
    memory_limit_bytes: int | None = None,
    cache: bool = True,
    verbose: bool = True,
    console: Console | None = None,
    measure: Measure | None = None,
) -> TuneResult:
    """Like :func:`tune`, but returns the whole :class:`TuneResult` (table rows, finders, timings).

    ``measure(plan, steps, warmup) -> Trial`` replaces the real trial (a test seam); it is
    called on deep copies of ``model`` by default through :func:`turbotrain.measure.run_trial`.
    """
    started = time.monotonic()
    if time_budget_s is not None and not time_budget_s > 0:
        raise ValueError(f"tune: time_budget_s={time_budget_s!r}; give seconds > 0, or None to derive it")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"tune: steps={steps!r}; give the run's length in optimizer steps (an integer >= 1)")
    if not isinstance(model, nn.Module):
        raise TypeError(f"tune: model must be a torch.nn.Module, got {type(model).__name__}")
    if loss_fn is None and step_fn is None:
        raise TypeError("tune: pass loss_fn(outputs, targets), or step_fn(model, batch) -> loss")
    if find_batch_size not in (False, True, "max", "keep-effective"):
        raise ValueError(
            f"tune: find_batch_size={find_batch_size!r}; use False, True/'max' (largest that fits) "
            "or 'keep-effective' (largest micro-batch, accumulating to the loader's batch)"
        )
    base = plan or Plan()
    hw = detect(base.device)
    console = (console or Console()) if verbose else None
    # RNGs (the loader's generators too) and backend flags, whatever a trial or a finder touches
    with preserved_state(generators=rng.generators_of(loader)):
        sample = _sample_batches(loader, batches)
        options = {
            "budget": time_budget_s,
            "steps": steps,
            "tolerance": tolerance,
            "min_gain": min_gain,
            "include": sorted(include) if include is not None else None,
            "exclude": sorted(exclude),
            "batch_size": find_batch_size,
            "workers": find_num_workers,
            "base": base.to_dict(),
            "batches": len(sample),
            "memory_limit": memory_limit_bytes,
            "step_fn": tune_cache.function_name(step_fn),
            "loader": [
                type(loader).__name__,
                getattr(loader, "num_workers", None),
                getattr(loader, "batch_size", None),
            ],
        }
        key = tune_cache.cache_key(model, sample[0], optimizer_fn, loss_fn, hw, options) if cache else None
        entry = tune_cache.load(key) if key else None
        result = _cached_result(entry, key) if entry and entry.get("version") == _CACHE_VERSION else None
        if result is None:
            result = _tune(
                model,
                loss_fn,
                optimizer_fn,
                loader,
                sample,
                base,
                hw,
                time_budget_s,
                started,
                run_steps=steps,
                step_fn=step_fn,
                tolerance=tolerance,
                min_gain=min_gain,
                include=include,
                exclude=exclude,
                find_batch_size=find_batch_size,
                find_num_workers=find_num_workers,
                memory_limit_bytes=memory_limit_bytes,
                console=console,
                measure=measure,
            )
            if key:
                path = tune_cache.store(key, {"version": _CACHE_VERSION, "result": result.to_dict()})
                result.cache_path = str(path) if path else None
    if console is not None:
        render(result, console)
    return result


def _cached_result(entry: dict[str, Any], key: str | None) -> TuneResult | None:
    """The cached result, or None (tune again) for an entry of the right version but the wrong shape."""
    try:
        result = TuneResult.from_dict(entry["result"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # ConfigError is a ValueError
        log.warning("turbotrain: ignoring a malformed tune cache entry %s.json (%s); tuning again", key, exc)
        return None
    result.from_cache, result.cache_path = True, str(tune_cache.cache_dir() / f"{key}.json")
    return result


def _tune(
    model,
    loss_fn,
    optimizer_fn,
    loader,
    sample,
    base: Plan,
    hw,
    budget_s: float | None,
    started: float,
    *,
    run_steps,
    step_fn,
    tolerance,
    min_gain,
    include,
    exclude,
    find_batch_size,
    find_num_workers,
    memory_limit_bytes,
    console,
    measure,
) -> TuneResult:
    info = inspect_model(model)
    candidates = build_candidates(hw, info, base, include=include, exclude=exclude)
    use_workers = find_num_workers and isinstance(loader, DataLoader)
    # Time kept back for the finders: the loader timing is short, the batch-size search is not.
    shares = budget_s if budget_s is not None else 4 * _FINDERS_S
    reserve = (min(10.0, 0.1 * shares) if use_workers else 0.0) + (0.25 * shares if find_batch_size else 0.0)
    deadline = started + budget_s if budget_s is not None else None
    search_budget = max(0.0, deadline - reserve - time.monotonic()) if deadline is not None else None
    status_until = deadline - reserve if deadline is not None else None  # a derived budget is known later

    def real_measure(plan: Plan, steps: int, warmup: int, give_up_s: float | None = None) -> Trial:
        return run_trial(
            model, optimizer_fn, loss_fn, sample, plan, steps=steps, warmup=warmup, step_fn=step_fn, give_up_s=give_up_s
        )

    found = search_plan(
        _status_measure(measure or real_measure, console, status_until),
        candidates,
        base,
        time_budget_s=search_budget,
        tolerance=tolerance,
        min_gain=min_gain,
        device_type=hw.device_type,
        run_steps=run_steps,
    )
    found.notes.append(
        f"timed on the first {len(sample)} batches of the loader, held on the {hw.device_type} (the training "
        "step alone: batch copies and loading are left to the rules and the num_workers finder)"
    )
    if deadline is None:  # a derived budget: the search's, then the finders' share
        deadline = time.monotonic() + reserve
    chosen = found.plan.replace(**candidates.by_rule)
    batch_result = None
    if find_batch_size:
        effective = batch_size_of(sample[0]) * base.grad_accum_steps if find_batch_size == "keep-effective" else None
        batch_result = batch_finder.find_batch_size(
            model,
            optimizer_fn,
            loss_fn,
            sample[0],
            chosen,
            memory_limit_bytes=memory_limit_bytes,
            effective_batch_size=effective,
            time_budget_s=max(1.0, deadline - time.monotonic()),
            step_fn=step_fn,
        )
        accum = batch_result.grad_accum_steps if effective else chosen.grad_accum_steps
        chosen = chosen.replace(batch_size=batch_result.batch_size, grad_accum_steps=accum)
    workers_result = None
    if use_workers:
        timed_loader = rebuild_loader(loader, batch_size=chosen.batch_size) if chosen.batch_size else loader
        rows = chosen.batch_size or batch_size_of(sample[0])
        workers_result = workers_finder.find_num_workers(
            timed_loader,
            device_type=hw.device_type,
            sample_batch=sample[0],
            needed_batches_per_s=found.samples_per_s / rows,
            time_budget_s=max(1.0, deadline - time.monotonic()),
        )
        chosen = chosen.replace(**workers_result.plan_changes())
    if not hw.is_cuda:  # threads and workers share the usable cores (quota and affinity)
        chosen = fit_plan(chosen, hw.usable_cores, hw.intra_op_threads, getattr(loader, "num_workers", None))
    return TuneResult(
        plan=chosen,
        search=found,
        hardware=hw.summary(),
        budget_s=budget_s if budget_s is not None else found.budget_s + reserve,
        elapsed_s=time.monotonic() - started,
        by_rule=dict(candidates.by_rule),
        workers=workers_result,
        batch_size=batch_result,
    )


def tune(
    model: nn.Module,
    loss_fn: Callable | None,
    loader: Iterable,
    optimizer_fn: Callable,
    time_budget_s: float | None = None,
    **options: Any,
) -> Plan:
    """The fastest plan that trains like fp32, measured on ``model`` and ``loader`` within the budget.

    The search starts from the rules' plan (what ``Plan.fast`` picks) and never returns a plan slower than
    it or the naive plan. ``time_budget_s=None`` derives the budget from the naive plan's step time;
    ``steps=N`` (the run's length) prices compile over that run: a compile that would not pay back
    within N steps is not chosen.

    ``optimizer_fn(params) -> optimizer`` builds a fresh optimizer for each trial. Prints a
    table of every candidate (samples/s, speed-up against the naive plan, peak memory,
    compile time, why it was rejected) unless ``verbose=False``. Never slower than the
    naive plan: when nothing helps it says so and returns ``Plan()``. Options: see
    :func:`tune_report` (``exclude=("compile",)``, ``find_batch_size="keep-effective"``, ...).
    """
    return tune_report(model, loss_fn, loader, optimizer_fn, time_budget_s, **options).plan
