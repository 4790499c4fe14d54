"""Measured, not guessed: short what-if trials on the user's own model, batch and DataLoader.

* Plan switches (mixed precision, channels_last, foreach/fused optimizer, set_to_none, conv bias
  removal, cudnn.benchmark, compile) run through :func:`turbotrain.measure.run_trial` on a copy
  of the captured model and batch, against a baseline that reproduces the script's own
  settings, timed before and after the candidates (the slower machine state is not credited).
  The loss is a surrogate (the mean square of the model's float outputs: bounded, so a few
  steps of it never diverge): the model's forward and backward are what is timed, not the
  user's loss.
* A larger batch: samples/s at a multiple of the captured batch.
* ``num_workers`` 0, 1, 2, ... with :func:`turbotrain.measure.time_loader` until it stops improving.
* Validation with autograd on: the captured model's eval forward with and without autograd.
* Hand-written attention: the user's attention shapes timed by hand and as
  ``scaled_dot_product_attention``.

A trial's gain is turned into a share of the user's step (Amdahl: only the part of the step the
trial models gets faster), which sets the finding's severity and ``est_speedup``.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import math
import sys
import types
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from ..data.transfer import resize_batch, tensors_in
from ..measure import HOPELESS, MIN_GAIN, Comparison, Trial, judge, run_trial, time_loader
from ..plan import Plan
from .findings import Finding, severity_for
from .trials import AttentionTrial, BatchTrial, EvalGradTrial, LoaderTrial, PlanTrial, ThreadsTrial

__all__ = ["run_what_ifs", "Budget"]

log = logging.getLogger("turbotrain")


@dataclass
class Budget:
    seconds: float

    def __post_init__(self) -> None:
        self.deadline = time.perf_counter() + self.seconds

    @property
    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def allows(self, cost_s: float) -> bool:
        return self.left >= cost_s


def surrogate_step(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """Forward the captured ``(args, kwargs)``; the loss is the mean square of the differentiable outputs."""
    args, kwargs = batch
    out = model(*args, **kwargs)
    parts = [t.float().pow(2).mean() for t in tensors_in(out) if t.is_floating_point() and t.requires_grad]
    if not parts:
        raise ValueError("the model's output holds no differentiable tensor to build a loss from")
    return torch.stack(parts).sum() if len(parts) > 1 else parts[0]


def _optimizer_fn(ctx) -> Callable:
    """Rebuild the user's optimizer (same class and hyper-parameters) for a copy of the model."""
    model_params = {id(p) for p in ctx.model.parameters()}
    chosen = next((opt for opt, _ in ctx.optimizers
                   if any(id(p) in model_params for g in opt.param_groups for p in g["params"])), None)
    if chosen is None:
        return lambda params: torch.optim.SGD(params, lr=1e-3)
    cls, defaults = type(chosen), constructor_defaults(chosen)
    try:
        cls([torch.zeros(1, requires_grad=True)], **defaults)
    except Exception:  # noqa: BLE001 - a custom optimizer whose defaults are not constructor arguments
        lr = defaults.get("lr", 1e-3)
        log.warning("turbotrain doctor: %s cannot be rebuilt from its defaults; the what-ifs time SGD instead",
                    cls.__name__)
        return lambda params: torch.optim.SGD(params, lr=float(lr) if not torch.is_tensor(lr) else lr.item())
    return lambda params: cls(params, **defaults)


def constructor_defaults(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's ``defaults`` that its constructor accepts. torch's own AdamW keeps a
    ``decoupled_weight_decay`` entry it does not take as an argument (torch 2.13): passing every
    default would make the rebuild fail and the what-ifs time some other optimizer."""
    params = inspect.signature(type(optimizer).__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in params}


def _baseline_plan(ctx) -> Plan:
    facts = ctx.facts
    precision = "fp32"
    if facts.autocast:
        precision = "fp16-mixed" if "float16" in str(facts.autocast_dtype) and "b" not in str(
            facts.autocast_dtype) else "bf16-mixed"
    zeros = bool(ctx.ran_sites("zero_grad_zeros"))
    return Plan(device=ctx.device, precision=precision, set_to_none=not zeros,
                channels_last=bool(facts.input_channels_last), cudnn_benchmark=bool(facts.cudnn_benchmark))


def typical_s(trial: Trial) -> float:
    """A trial's step time robust to interference: its fastest step (other processes only ever add time,
    and on a busy machine most steps of a short trial may carry some)."""
    return min(trial.step_times_s) if trial.step_times_s else float("inf")


def _model_share(ctx) -> float:
    return ctx.share("compute") + ctx.share("optimizer") + ctx.share("python_overhead")


def _inexact(finding: Finding) -> bool:
    from ..speedups.registry import get

    try:
        return finding.speedup is not None and not get(finding.speedup).exact
    except KeyError:
        return False


def _apply_ratio(finding: Finding, ctx, verdict: Comparison, what_if: dict, unit: str = "step time",
                 applies_to: float | None = None) -> None:
    """Turn a judged speed ratio of the model's step (:func:`turbotrain.measure.judge`) into the finding's
    share of the whole step.

    A ratio the noise model cannot separate from 1.0 (the rounds' own spread, or this window's noise
    floor: another process busy, steps spread wide) counts as no gain and rates ``low``, whatever it
    reads; a switch that changes numerics must buy at least 10% to rate above ``low``.
    """
    ratio = verdict.speedup
    part = _model_share(ctx) if applies_to is None else applies_to
    share = part * (1.0 - 1.0 / ratio) if ratio > 0 else 0.0
    what_if["ratio"] = round(ratio, 3)
    what_if["noise"] = round(verdict.noise, 3)
    what_if["verdict"] = verdict.verdict
    finding.what_if = what_if
    finding.measured = True
    finding.gain_share = share
    finding.est_speedup = round(1.0 / (1.0 - min(share, 0.95)), 3)
    finding.severity = severity_for(share)
    if not verdict.faster:
        finding.severity = "low"
        why = (f"not separable from noise here (x{ratio:.2f}, needs over x{1 + max(MIN_GAIN, verdict.noise):.2f})"
               if ratio >= 1 + MIN_GAIN else f"no gain (x{ratio:.2f} on the model's {unit})")
        finding.note = f"Measured on this machine: {why}. {finding.note or ''}"
    elif _inexact(finding) and share < 0.10 and finding.severity != "low":
        finding.severity = "low"
        finding.note = f"It changes numerics and buys under 10% here. {finding.note or ''}"
    finding.note = (finding.note or "").strip() or None


class _ModelTrials:
    """Baseline and candidate trials on one captured model and batch."""

    def __init__(self, ctx, budget: Budget):
        self.ctx, self.budget = ctx, budget
        self.model = ctx.capture.module
        self.batches = [(ctx.capture.args, ctx.capture.kwargs)]
        self.optimizer_fn = _optimizer_fn(ctx)
        self.base_plan = _baseline_plan(ctx)
        model_s = max(1e-4, ctx.seconds("compute") + ctx.seconds("optimizer") + ctx.seconds("python_overhead"))
        self.steps = int(min(10, max(3, 0.8 / model_s)))
        self.warmup = 2
        self.cost = (self.steps + self.warmup) * model_s * 1.5 + 0.05
        self.baselines: list[Trial] = []

    def trial(self, plan: Plan, batches=None, warmup: int | None = None, give_up_s: float | None = None) -> Trial:
        return run_trial(self.model, self.optimizer_fn, None, batches or self.batches, plan, steps=self.steps,
                         warmup=warmup or self.warmup, step_fn=surrogate_step, give_up_s=give_up_s)

    def baseline(self) -> Trial | None:
        if not self.budget.allows(self.cost):
            return None
        trial = self.trial(self.base_plan)
        if trial.ok:
            self.baselines.append(trial)
        return trial

    @property
    def base_s(self) -> float:
        # The faster baseline: a gain is never credited to the machine getting busier meanwhile.
        return min(typical_s(t) for t in self.baselines) if self.baselines else float("inf")


def _rounds(ctx, budget: Budget, cost: float, first: tuple[float, float] | None,
            pair: Callable[[], tuple[float, float] | None]) -> list[float]:
    """Per-round speed ratios (baseline seconds / candidate seconds), A/B interleaved: two rounds, and a
    third when the two disagree about the direction and the budget allows."""
    times = [first] if first is not None else []
    while len(times) < 2 and budget.allows(cost):
        got = pair()
        if got is None:
            break
        times.append(got)
    ratios = [b / c for b, c in times if c > 0]
    if len(ratios) == 2 and (ratios[0] > 1) != (ratios[1] > 1) and budget.allows(cost):
        got = pair()
        if got is not None and got[1] > 0:
            ratios.append(got[0] / got[1])
    return ratios


def _plan_trials(ctx, findings: list[Finding], budget: Budget, allow_compile: bool) -> None:
    wanted = [f for f in findings if isinstance(f.trial, PlanTrial) and (allow_compile or not f.trial.compile)]
    if not wanted or ctx.capture is None or ctx.facts.compiled:
        return
    trials = _ModelTrials(ctx, budget)
    first = trials.baseline()
    if first is None or not first.ok:
        reason = first.error if first is not None else "the what-if time budget is spent"
        for f in wanted:
            f.note = f"Not measured: {reason}. {f.note or ''}".strip()
        return
    for f in sorted(wanted, key=lambda f: f.trial.compile):
        changes = dict(f.trial.changes)
        base = trials.base_plan.replace(**f.trial.baseline)
        plan = base.replace(**changes)
        compiling = bool(changes.get("compile"))
        cost = trials.cost * (8 if compiling else 2)
        if not budget.allows(cost):
            f.note = f"Not measured: the what-if time budget is spent. {f.note or ''}".strip()
            continue
        seen: dict[str, Any] = {}

        def pair(base=base, plan=plan, compiling=compiling, seen=seen) -> tuple[float, float] | None:
            """One round: the baseline, then the candidate right after it (the same machine load)."""
            ref = trials.trial(base)
            if not ref.ok:
                return None
            trial = trials.trial(plan, warmup=3 if compiling else None,
                                 give_up_s=None if compiling else HOPELESS * typical_s(ref))
            seen.setdefault("first", trial)
            seen["last"] = trial
            if not trial.ok:
                return None
            return typical_s(ref), typical_s(trial)

        first_round = pair()
        trial = seen.get("first")
        entries = {_entry_for_field(k) for k in changes}
        skipped = [name for name, _ in trial.skipped if name in entries] if trial is not None else []
        if trial is None or skipped or (first_round is None and not trial.stopped_early):
            why = (trial.error if trial is not None else None) or "; ".join(w for _, w in (trial.skipped if trial else []))
            f.note = f"Not measured: {why or 'the baseline failed'}. {f.note or ''}".strip()
            continue
        if trial.stopped_early:
            ratios = [1.0 / HOPELESS]  # slower than HOPELESS times the baseline: no need for more rounds
        else:
            # Compile: one round (the graph compiles once per trial).
            ratios = [first_round[0] / first_round[1]] if compiling else _rounds(
                ctx, budget, trials.cost * 2, first_round, pair)
        f.what_if = {"kind": "plan", "changes": changes, "steps": trials.steps,
                     "rounds": [round(r, 3) for r in ratios],
                     "losses_finite": all(map(math.isfinite, trial.losses))}
        if trial.ok:
            f.what_if["candidate_ms"] = round(typical_s(trial) * 1e3, 3)
        if compiling:
            f.what_if["compile_s"] = round(trial.warmup_s, 2)
            f.note = f"Compiling took {trial.warmup_s:.1f} s (once per run)."
        _apply_ratio(f, ctx, judge(ratios, noise_floor=ctx.noise_floor), f.what_if)


def _entry_for_field(field: str) -> str:
    from ..speedups.registry import by_field

    try:
        return by_field(field).name
    except KeyError:
        return field


def repeat_batch(capture, k: int) -> tuple:
    """The captured (args, kwargs) with every batch-sized tensor repeated ``k`` times along dim 0."""
    n = capture.batch_size
    return resize_batch((capture.args, capture.kwargs), n * k, rows=n, dim=capture.batch_dim)


def _batch_trial(ctx, finding: Finding, budget: Budget) -> None:
    if ctx.capture is None or ctx.facts.compiled:
        return
    batch = ctx.capture.batch_size
    k = max(2, min(8, 64 // max(1, batch)))
    trials = _ModelTrials(ctx, budget)
    if not budget.allows(trials.cost * 3):
        return
    bigger = [repeat_batch(ctx.capture, k)]
    seen: dict[str, Trial] = {}

    def pair() -> tuple[float, float] | None:
        """One round: the captured batch, then k times it; seconds per sample of each."""
        base = trials.trial(trials.base_plan)
        big = trials.trial(trials.base_plan, batches=bigger)
        seen["base"], seen["big"] = base, big
        if not (base.ok and big.ok):
            return None
        return typical_s(base) / base.samples_per_step, typical_s(big) / big.samples_per_step

    first = pair()
    if first is None:
        finding.note = f"Not measured: {seen['base'].error or seen['big'].error}. {finding.note or ''}".strip()
        return
    ratios = _rounds(ctx, budget, trials.cost * 3, first, pair)
    base, big = seen["base"], seen["big"]
    finding.fix.plan = {"batch_size": batch * k}
    _apply_ratio(finding, ctx, judge(ratios, noise_floor=ctx.noise_floor),
                 {"kind": "batch", "batch_size": batch, "candidate_batch_size": batch * k,
                  "rounds": [round(r, 3) for r in ratios],
                  "baseline_samples_per_s": round(base.samples_per_step / typical_s(base), 1),
                  "candidate_samples_per_s": round(big.samples_per_step / typical_s(big), 1)}, unit="samples/s",
                 # A DataLoader's per-batch cost (fetching, collating, the iterator) is paid per batch as the
                 # model's dispatch is: a batch k times larger spreads both over k times the samples.
                 applies_to=min(1.0, _model_share(ctx) + (ctx.share("data_loading") if ctx.main_loader else 0.0)))


def _setting_rounds(ctx, budget: Budget, now: tuple[int, int], options: list[tuple[int, int]]
                    ) -> tuple[tuple[int, int], list[float], dict[str, Trial]] | str:
    """:func:`_timed_settings` without torch's "more workers than cores" advice (the trial means it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return _timed_settings(ctx, budget, now, options)


def _timed_settings(ctx, budget: Budget, now: tuple[int, int], options: list[tuple[int, int]]
                    ) -> tuple[tuple[int, int], list[float], dict[str, Trial]] | str:
    """(intra-op threads, DataLoader workers) settings timed against the script's own ``now`` on a copy of its
    model, each step also pulling a batch from its own loader (so workers compete for the cores as they do
    in the script), A/B interleaved: the best option, its per-round ratios and the last trials; or why not.
    Medians, not fastest steps: contention slows every step."""
    from ..data.loader import rebuild_loader

    trials = _ModelTrials(ctx, budget)
    record = ctx.main_loader
    streams: dict[int, Any] = {}

    def pull(workers: int) -> None:
        if record is None:
            return
        if workers not in streams:
            streams[workers] = iter(rebuild_loader(record.loader, num_workers=workers))
        try:
            next(streams[workers])
        except StopIteration:
            streams[workers] = iter(rebuild_loader(record.loader, num_workers=workers))
            next(streams[workers])

    def timed(threads: int, workers: int) -> Trial:
        def step(model, batch):
            pull(workers)  # the loader's work is part of the step, as in the script
            return surrogate_step(model, batch)

        # Idle workers fill their queues (workers x prefetch_factor batches) while the other setting is
        # timed: those come for free, so they are drained in the warm-up and the timed steps outnumber them.
        buffered = workers * (getattr(record.loader, "prefetch_factor", None) or 2) if record is not None else 0
        return run_trial(trials.model, trials.optimizer_fn, None, trials.batches,
                         trials.base_plan.replace(intra_op_threads=threads), steps=max(trials.steps, 2 * buffered),
                         warmup=trials.warmup + buffered, step_fn=step)

    seen: dict[str, Trial] = {}

    def pair(fix: tuple[int, int]) -> tuple[float, float] | None:
        a, b = timed(*now), timed(*fix)
        seen["now"], seen["fix"] = a, b
        return (a.step_s, b.step_s) if a.ok and b.ok else None

    try:
        if not budget.allows(trials.cost * (1 + len(options)) + 2.0):
            return "the what-if time budget is spent"
        # Round one times every option next to the script's setting; the best goes on to more rounds.
        firsts = {fix: pair(fix) for fix in options}
        timed_ok = {fix: t for fix, t in firsts.items() if t is not None}
        if not timed_ok:
            return seen["now"].error or seen["fix"].error or "the trials failed"
        fix = max(timed_ok, key=lambda c: timed_ok[c][0] / timed_ok[c][1])
        return fix, _rounds(ctx, budget, trials.cost * 2, timed_ok[fix], lambda: pair(fix)), seen
    finally:
        streams.clear()  # worker processes end with their iterators


def _threads_trial(ctx, finding: Finding, budget: Budget) -> None:
    """The script's threads and workers against the recommended settings (:func:`_setting_rounds`)."""
    if ctx.capture is None or not finding.trial.candidates:
        return
    now = (ctx.machine.get("intra_op_threads") or torch.get_num_threads(), finding.evidence.get("workers", 0))
    options = list(finding.trial.candidates)
    got = _setting_rounds(ctx, budget, now, options)
    if isinstance(got, str):
        finding.note = f"Not measured: {got}."
        return
    fix, ratios, seen = got
    _name_the_fix(finding, now, fix)
    applies = _model_share(ctx) + ctx.share("data_loading")
    _apply_ratio(finding, ctx, judge(ratios, noise_floor=ctx.noise_floor),
                 {"kind": "threads", "now": {"threads": now[0], "workers": now[1]}, "tried": options,
                  "candidate": {"threads": fix[0], "workers": fix[1]}, "rounds": [round(r, 3) for r in ratios],
                  "baseline_ms": round(seen["now"].step_s * 1e3, 3), "candidate_ms": round(seen["fix"].step_s * 1e3, 3)},
                 applies_to=min(1.0, applies))


def _name_the_fix(finding: Finding, now: tuple[int, int], fix: tuple[int, int]) -> None:
    """Say the measured setting: the exact line and environment variable."""
    threads, workers = fix
    text = f"torch.set_num_threads({threads}) at the top of the script (or OMP_NUM_THREADS={threads})"
    plan: dict[str, Any] = {"intra_op_threads": threads}
    if workers != now[1]:
        text += f", and DataLoader(..., num_workers={workers})"
        plan["num_workers"] = workers
    finding.fix.pytorch, finding.fix.plan = text, plan
    finding.evidence.update(recommended_threads=threads, recommended_workers=workers)


def _cap_to_noise(finding: Finding, ctx) -> None:
    """A gain measured by a single timed comparison (loader rates, a forward with and without autograd, an
    attention by hand and fused) is held to this window's noise floor: one it cannot be told from rates
    ``low``. What is judged is the comparison's own ratio (``pair_ratio``): a 1.6x faster attention
    is not noise because attention is a sixth of the step; the step-level figure is arithmetic on it."""
    pair = finding.what_if.get("pair_ratio")
    if pair is None or "verdict" in finding.what_if or not ctx.noise_floor:
        return  # a finding judged from interleaved rounds already carries its verdict
    verdict = judge([pair] * finding.what_if.get("pair_rounds", 1), noise_floor=ctx.noise_floor)
    if not verdict.faster and finding.severity != "low":
        finding.cap("low", f"This machine was too noisy during the run to tell the measured x{pair:.2f} from no "
                           f"gain (it needs over x{1 + verdict.noise:.2f}).")


def _loader_trial(ctx, finding: Finding, budget: Budget) -> None:
    record = ctx.main_loader
    if record is None:
        return
    loader = record.loader
    current = record.settings["num_workers"]
    data_s = max(ctx.seconds("data_loading"), 1e-6)
    step = ctx.step_s
    other = max(step - data_s, 0.0)
    batches = int(min(30, max(4, 1.0 / data_s)))
    rates: dict[int, float] = {}
    # The run itself timed the current setting; re-time it here too so every count is measured alike.
    limit = max(2, min(8, 2 * ctx.hw.cpu_cores))
    candidates = sorted({current, 0, 1, 2, 3, 4, 6, 8} - {w for w in (6, 8) if w > limit})
    best, best_rate, worse = current, 0.0, 0
    for workers in candidates:
        if workers > limit or not budget.allows((batches + 2) * data_s / max(1, workers) + 1.0):
            break
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch's "more workers than cores" advice
                rate = time_loader(loader, batches=batches, warmup=2, num_workers=workers)
        except Exception as exc:  # noqa: BLE001 - a dataset that cannot go to workers (unpicklable, ...)
            finding.note = f"num_workers={workers} failed: {type(exc).__name__}: {exc}"
            break
        rates[workers] = rate
        if rate > best_rate * 1.10:
            best, best_rate, worse = workers, rate, 0
        else:
            worse += 1
            if worse >= 2 and workers > current:
                break  # stopped improving
    if not rates or best_rate <= 0:
        return
    def projected(workers: int) -> float:
        rate = rates[workers]
        return max(other, 1.0 / rate) if workers > 0 else other + 1.0 / rate

    # Both ends from this trial's own timings: the current setting re-timed, against the best.
    now = projected(current) if current in rates else step
    share = max(0.0, 1.0 - projected(best) / now) if now else 0.0
    finding.what_if = {"kind": "num_workers", "batches_per_s": {str(k): round(v, 2) for k, v in rates.items()},
                       "best_num_workers": best, "projected_step_ms": round(projected(best) * 1e3, 3),
                       "current_projected_step_ms": round(now * 1e3, 3), "step_ms": round(step * 1e3, 3),
                       # one timing per setting
                       "pair_ratio": round(now / projected(best), 3) if projected(best) > 0 else 1.0, "pair_rounds": 1}
    if best != current:
        finding.fix.plan = {"num_workers": best}
        finding.fix.pytorch = f"DataLoader(..., num_workers={best}, persistent_workers=True)"
        finding.fix.lightning = f"DataLoader(..., num_workers={best})"
        finding.fix.accelerate = f"DataLoader(..., num_workers={best}) before accelerator.prepare(...)"
    finding.set_gain(share, measured=True)
    finding.note = (f"Loader rates measured for num_workers {', '.join(map(str, rates))}; the step is projected as "
                    "max(the rest of the step, one batch's loading time). Workers share the CPU with training.")
    if best != current and ctx.capture is not None:
        _verify_workers(ctx, finding, budget, current, best)


def _verify_workers(ctx, finding: Finding, budget: Budget, current: int, best: int) -> None:
    """The projection leaves out that workers take cores from training: time the model training beside the
    loader, with the script's workers and with ``best``, interleaved (:func:`_setting_rounds`)."""
    threads = ctx.machine.get("intra_op_threads") or torch.get_num_threads()
    got = _setting_rounds(ctx, budget, (threads, current), [(threads, best)])
    if isinstance(got, str):
        return  # the projection stands
    _, ratios, seen = got
    finding.what_if.update(rounds=[round(r, 3) for r in ratios], baseline_ms=round(seen["now"].step_s * 1e3, 3),
                           candidate_ms=round(seen["fix"].step_s * 1e3, 3))
    _apply_ratio(finding, ctx, judge(ratios, noise_floor=ctx.noise_floor), finding.what_if,
                 applies_to=min(1.0, _model_share(ctx) + ctx.share("data_loading")))
    finding.note = (f"num_workers={best} had the best loader rate alone; timed with your model training beside the "
                    "loader (workers share the cores with training), interleaved with your setting.")


def time_once(fn: Callable[[], None], cuda: bool) -> float:
    """Seconds for one call of ``fn``, the device's queued work included."""
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - started


def fastest_pair(a: Callable[[], None], b: Callable[[], None], cuda: bool, repeats: int) -> tuple[float, float]:
    """Seconds per call of ``a`` and ``b``, timed alternately, the fastest of ``repeats`` each (another
    process only ever adds time, and alternating spreads it over both)."""
    t_a = t_b = float("inf")
    for _ in range(repeats):
        t_a = min(t_a, time_once(a, cuda))
        t_b = min(t_b, time_once(b, cuda))
    return t_a, t_b


def _pair_ratio(slow_s: float, fast_s: float) -> dict[str, Any]:
    """The what-if keys :func:`_cap_to_noise` judges: :func:`fastest_pair`'s 7 alternations count as two
    interleaved rounds."""
    return {"pair_ratio": round(slow_s / fast_s, 3) if fast_s > 0 else 1.0, "pair_rounds": 2}


def _time_pair(finding: Finding, slow: Callable[[], None], fast: Callable[[], None],
               cuda: bool, repeats: int = 7) -> tuple[float, float] | None:
    """:func:`fastest_pair` after one untimed call of each; None (and a note) when one fails."""
    try:
        slow()
        fast()
        return fastest_pair(slow, fast, cuda, repeats)
    except Exception as exc:  # noqa: BLE001 - a model that cannot run this way: the finding stays estimated
        finding.note = f"Not measured: {type(exc).__name__}: {exc}"
        return None


def _eval_grad_trial(ctx, finding: Finding, budget: Budget) -> None:
    if ctx.capture is None or not budget.allows(2.0):
        return
    model = copy.deepcopy(ctx.capture.module).eval()
    args, kwargs = ctx.capture.args, ctx.capture.kwargs

    def forward(grad: bool) -> Callable[[], None]:
        def run() -> None:
            with torch.enable_grad() if grad else torch.inference_mode():
                model(*args, **kwargs)
        return run

    pair = _time_pair(finding, forward(True), forward(False), cuda=ctx.device == "cuda")
    if pair is None:
        return
    with_grad, without = pair
    saving = max(0.0, 1.0 - without / with_grad) if with_grad > 0 else 0.0
    share = finding.trial.share * saving
    finding.what_if = {"kind": "eval_grad", "forward_ms_with_grad": round(with_grad * 1e3, 3),
                       "forward_ms_inference_mode": round(without * 1e3, 3),
                       **_pair_ratio(with_grad, without)}
    finding.set_gain(share, measured=True)


def _attention_trial(ctx, finding: Finding, budget: Budget) -> None:
    trial = finding.trial
    if not trial.per_step or not budget.allows(3.0):
        return
    first, last = trial.lines
    softmax = ctx.stat_at("softmax", trial.softmax)
    score_shape = softmax.detail.get("shape") if softmax else None
    shapes = [(site, s) for site, s in ctx.matmul_shapes.items()
              if site.file == trial.file and first <= site.line <= last]
    qk = next(((a, b) for _, (a, b) in shapes if len(a) >= 3 and len(b) >= 3 and score_shape is not None
               and tuple(a[:-1]) + (b[-1],) == tuple(score_shape)), None)
    if qk is None:
        finding.note = "Not measured: the attention's operand shapes were not seen during warm-up."
        return
    (q_shape, kt_shape) = qk
    lead, length, dim, keys = q_shape[:-2], q_shape[-2], q_shape[-1], kt_shape[-1]
    device = ctx.device if ctx.device in ("cpu", "cuda") else "cpu"
    dtype = next(ctx.model.parameters()).dtype
    gen = torch.Generator(device="cpu").manual_seed(0)

    def make(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_()

    q, k, v = make(*lead, length, dim), make(*lead, keys, dim), make(*lead, keys, dim)
    causal = trial.causal and length == keys
    mask = torch.ones(length, keys, dtype=torch.bool, device=device).triu(1) if causal else None

    def manual():
        scores = (q @ k.transpose(-2, -1)) * dim ** -0.5
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        out = scores.softmax(-1) @ v
        out.sum().backward()

    def fused():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.sum().backward()

    pair = _time_pair(finding, manual, fused, cuda=device == "cuda")
    if pair is None:
        return
    t_manual, t_fused = pair
    saved = trial.per_step * max(0.0, t_manual - t_fused)
    share = min(saved / ctx.step_s, _model_share(ctx)) if ctx.step_s else 0.0
    finding.what_if = {"kind": "attention", "q_shape": list(q_shape), "keys": keys, "causal": causal,
                       "manual_ms": round(t_manual * 1e3, 3), "sdpa_ms": round(t_fused * 1e3, 3),
                       "calls_per_step": trial.per_step, **_pair_ratio(t_manual, t_fused)}
    finding.set_gain(share, measured=True)
    finding.note = ("Timed forward+backward at your attention's shapes, hand-written"
                    + (" with a causal mask" if causal else "") + " against scaled_dot_product_attention.")


@contextlib.contextmanager
def _script_as_main(ctx) -> Iterator[None]:
    """The user's script back as ``__main__`` while its model is re-run: runpy restored the doctor's own
    ``__main__`` when the script ended, and torch.compile resolves a class defined in the script
    through ``sys.modules["__main__"]``."""
    model = ctx.capture.module if ctx.capture is not None else None
    # Any layer the script defined counts: an nn.Sequential (torch's class) of the script's own modules too.
    mine = next((m for m in (model.modules() if model is not None else ()) if type(m).__module__ == "__main__"), None)
    script_globals = getattr(getattr(type(mine), "forward", None), "__globals__", None)
    if mine is None or not script_globals:
        yield
        return
    saved = sys.modules.get("__main__")
    stand_in = types.ModuleType("__main__")
    stand_in.__dict__.update(script_globals)
    sys.modules["__main__"] = stand_in
    try:
        yield
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def run_what_ifs(ctx, findings: list[Finding], budget_s: float = 30.0, allow_compile: bool = False) -> None:
    """Measure what the findings' fixes buy (in place), within ``budget_s`` seconds."""
    with _script_as_main(ctx):
        _run_what_ifs(ctx, findings, budget_s, allow_compile)


def _run_what_ifs(ctx, findings: list[Finding], budget_s: float, allow_compile: bool) -> None:
    budget = Budget(budget_s)
    def of(kind: type) -> list[Finding]:
        return [f for f in findings if isinstance(f.trial, kind)]

    steps: list[tuple[str, Callable]] = []
    for f in of(ThreadsTrial):  # first: on a contended machine every other trial is skewed by it
        steps.append(("threads", lambda f=f: _threads_trial(ctx, f, budget)))
    for f in of(LoaderTrial):
        steps.append(("num_workers", lambda f=f: _loader_trial(ctx, f, budget)))
    for f in of(BatchTrial):
        steps.append(("batch", lambda f=f: _batch_trial(ctx, f, budget)))
    if of(PlanTrial):
        steps.append(("plan", lambda: _plan_trials(ctx, of(PlanTrial), budget, allow_compile)))
    for f in of(AttentionTrial):
        steps.append(("attention", lambda f=f: _attention_trial(ctx, f, budget)))
    for f in of(EvalGradTrial):
        steps.append(("eval_grad", lambda f=f: _eval_grad_trial(ctx, f, budget)))
    for name, fn in steps:
        if budget.left <= 0:
            break
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a failed what-if leaves the finding estimated
            log.warning("turbotrain doctor: what-if %s failed: %s: %s", name, type(exc).__name__, exc)
    for f in findings:
        if f.measured and f.what_if:
            _cap_to_noise(f, ctx)
