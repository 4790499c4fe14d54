"""Timing a Plan on a user's own model and batches: the one measurement doctor, tune and bench share.

``run_trial`` trains a *copy* of the model (the original, its optimizer and every RNG are
left exactly as they were) for a few steps on a fixed list of batches, and reports
steady-state time per step, the first steps' (compile) time separately, peak memory and
the loss of every step, so a caller can compare plans for speed and for numerics.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import itertools
import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Final, Iterable, Iterator, Literal, Sequence, TypeVar

import torch
from torch import nn

try:
    import resource
except ImportError:  # not on Windows: page faults then read as 0
    resource = None  # type: ignore[assignment]  # checked before its use

from .hardware import read_proc_kib
from .plan import Plan
from .runtime import Runtime, prepare
from .data import stats as read_stats
from .data.transfer import batch_size_of
from .train import rng

__all__ = [
    "Trial",
    "run_trial",
    "EpochTrial",
    "run_epochs",
    "time_loader",
    "preserved_state",
    "peak_host_memory",
    "Comparison",
    "judge",
    "relative_spread",
    "run_means",
    "MIN_GAIN",
    "HOPELESS",
    "FASTER",
    "SLOWER",
    "NOISE",
    "UNVERIFIED",
    "copy_for_trial",
]

log = logging.getLogger("turbotrain")


# -- when a measured ratio is a gain: the one definition doctor, tune and bench share -----------------

Verdict = Literal["faster", "slower", "within noise", "unverified"]
"""What :func:`judge` makes of a comparison (UNVERIFIED: fewer rounds than asked for)."""
FASTER: Final = "faster"
SLOWER: Final = "slower"
NOISE: Final = "within noise"
UNVERIFIED: Final = "unverified"

MIN_GAIN = 0.03
"""The smallest gain called a gain, as a fraction (3%): below it is timing noise even on a quiet machine."""

HOPELESS = 3.0
"""A candidate whose steps take this many times its baseline's is stopped: it cannot win, and a 0.06x
trial would spend the whole budget (bf16 on a CPU without native bf16)."""


HOPELESS_STEPS = 2
"""How many steps over the give-up time stop a trial: a hopeless candidate's every step is slow."""

HOPELESS_FLOOR_S = 0.2
"""Steps shorter than this are never stopped early: a one-off cost (a kernel's first use) can make a
sub-millisecond step 30x slower once, and letting such a trial finish costs next to nothing."""


@dataclass(frozen=True)
class Comparison:
    speedup: float  # candidate speed / baseline speed, over paired rounds (> 1: faster)
    noise: float  # the margin a speed-up had to clear: the larger of the given floor and the ratios' spread
    verdict: Verdict

    @property
    def called(self) -> bool:
        return self.verdict in (FASTER, SLOWER)

    @property
    def faster(self) -> bool:
        return self.verdict == FASTER


T = TypeVar("T")


def copy_for_trial(obj: T) -> T:
    """``copy.deepcopy(obj)`` (a model, or models and optimizers together), where a tensor a module keeps that is
    part of an autograd graph (an RL policy's saved log-probabilities) is copied detached: deepcopy refuses a
    tensor that is not a graph leaf, and a trial needs none of the user's graph."""
    memo: dict[int, Any] = {id(t): t.detach().clone() for t in _graph_tensors(obj)}
    copied = copy.deepcopy(obj, memo)
    for original, twin in _optimizers_in(obj, copied):
        # Optimizer.__getstate__ keeps defaults, state and param_groups only: an attribute a subclass sets in its
        # __init__ (nanochat's MuonAdamW keeps its 0-D step tensors there) is copied here, through the same memo.
        # Data only: a function kept on the instance holds the original (an LR scheduler replaces ``opt.step`` with
        # a wrapper that steps the original optimizer through a weak reference); the copy keeps its class's.
        for name, value in vars(original).items():
            if name not in vars(twin) and not inspect.isroutine(value):
                setattr(twin, name, copy.deepcopy(value, memo))
    return copied


def _optimizers_in(obj: Any, copied: Any) -> Iterator[tuple[torch.optim.Optimizer, torch.optim.Optimizer]]:
    """The optimizers among ``obj`` (itself, or in its lists and tuples) with their copies in ``copied``."""
    if isinstance(obj, torch.optim.Optimizer):
        yield obj, copied
    elif isinstance(obj, (list, tuple)):
        for item, twin in zip(obj, copied):
            yield from _optimizers_in(item, twin)


def _graph_tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Non-leaf tensors held in the plain attributes of ``obj``'s modules (lists, tuples, dicts, a few deep)."""
    if isinstance(obj, nn.Module):
        if depth:
            return  # a module met inside another's attributes: walked through the outer one's modules()
        for module in obj.modules():
            kept = [v for k, v in vars(module).items() if k not in ("_parameters", "_buffers", "_modules")]
            yield from _graph_tensors(kept, depth + 1)
    elif isinstance(obj, torch.Tensor):
        if obj.grad_fn is not None:
            yield obj
    elif isinstance(obj, (list, tuple, set)) and depth < 4:
        for item in obj:
            # the models and optimizers copied together: each model walked from the top
            yield from _graph_tensors(item, 0 if depth == 0 and isinstance(item, nn.Module) else depth + 1)
    elif isinstance(obj, dict) and depth < 4:
        for item in obj.values():
            yield from _graph_tensors(item, depth + 1)


def relative_spread(values: Sequence[float]) -> float:
    """(max - min) / median of repeated measurements; 0 for fewer than two."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid > 0 else float("inf")


def run_means(values: Sequence[float], length: int) -> list[float]:
    """The means of consecutive runs of ``length`` values (a partial last run is left out); the values
    themselves for ``length`` under 2 or fewer values than one run.

    Step times of a loop fed by DataLoader workers come in rounds: the workers finish their batches
    together, so a few steps take one at once and the next waits for the whole round. A median of single
    steps picks a step that waited for nothing; runs as long as a round each hold one whole."""
    if length < 2 or len(values) < length:
        return list(values)
    return [sum(values[i : i + length]) / length for i in range(0, len(values) - length + 1, length)]


def robust_spread(values: Sequence[float]) -> float:
    """Twice the median absolute deviation over the median (0 for fewer than three values)."""
    if len(values) < 3:
        return 0.0
    mid = statistics.median(values)
    return 2 * statistics.median(abs(v - mid) for v in values) / mid if mid > 0 else float("inf")


def judge(
    ratios: Sequence[float], min_gain: float = MIN_GAIN, noise_floor: float = 0.0, min_rounds: int = 1
) -> Comparison:
    """Whether a candidate is faster than its baseline, from per-round speed ratios (candidate / baseline).

    The noise model. Each ratio comes from one round in which the baseline and the candidate ran back
    to back (A/B, then A/B again), so load that comes and goes hits both sides of a round alike and
    the ratio keeps only what is left of it. What is left shows as the rounds disagreeing: their
    relative spread: ``(max - min) / median`` of one or two rounds, and from three rounds on twice the
    median absolute deviation over the median (robust: one round caught by a load burst does not set
    the margin for the others, which is what a third round is for). Outside knowledge
    of the machine (another process busy during the window, steps spread wide) comes in as
    ``noise_floor``; it weighs less as interleaved rounds accumulate (divided by their number), since
    rounds that agree are themselves evidence taken under that very load. The speed-up is the median
    ratio (the geometric mean of two); it is a gain only when it clears ``1 + max(min_gain, noise)``,
    and with two rounds only when both say faster. Slower mirrors that on a log scale (2x faster and
    2x slower are the same distance from 1). Fewer than ``min_rounds`` rounds are never called.
    """
    if not ratios:
        raise ValueError("judge needs at least one paired ratio")
    if min(ratios) <= 0:
        return Comparison(0.0, noise_floor, SLOWER if len(ratios) >= min_rounds else UNVERIFIED)
    speedup = statistics.geometric_mean(ratios) if len(ratios) == 2 else statistics.median(ratios)
    noise = max(noise_floor / len(ratios), robust_spread(ratios) if len(ratios) >= 3 else relative_spread(ratios))
    margin = 1.0 + max(min_gain, noise)
    verdict: Verdict
    if len(ratios) < min_rounds:
        verdict = UNVERIFIED
    elif speedup >= margin and (len(ratios) != 2 or min(ratios) > 1.0):
        verdict = FASTER
    elif speedup <= 1.0 / margin and (len(ratios) != 2 or max(ratios) < 1.0):
        verdict = SLOWER
    else:
        verdict = NOISE
    return Comparison(speedup, noise, verdict)


@dataclass(kw_only=True)
class _Outcome:
    """What every kind of trial reports besides its timings."""

    peak_memory_bytes: int | None = None
    applied: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None
    stopped_early: bool = False  # hopeless: its steps took over HOPELESS times the baseline's


@dataclass
class Trial(_Outcome):
    plan: Plan
    samples_per_step: int
    step_times_s: list[float] = field(default_factory=list)  # steady-state steps only
    warmup_s: float = 0.0  # the warm-up steps (compile, autotune)
    losses: list[float] = field(default_factory=list)  # every step, warm-up included
    page_faults_per_step: float = 0.0  # minor page faults of the process, timed steps
    loader_round: int = 0  # steps one round of DataLoader workers feeds (0: no workers pulled)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.step_times_s)

    @property
    def step_s(self) -> float:
        """Median steady-state seconds per optimizer step; fed by DataLoader workers, the median of the means
        of runs of ``loader_round`` steps (:func:`run_means`)."""
        if not self.step_times_s:
            return float("inf")
        return statistics.median(run_means(self.step_times_s, min(self.loader_round, len(self.step_times_s) // 3)))

    @property
    def spread(self) -> float:
        """Relative spread of step times: (p90 - p10) / median."""
        if len(self.step_times_s) < 3:
            return 0.0
        q = statistics.quantiles(self.step_times_s, n=10)
        return (q[-1] - q[0]) / self.step_s

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_step / self.step_s if self.ok else 0.0

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else float("nan")


def peak_host_memory() -> int | None:
    """This process's peak resident memory (VmHWM) in bytes, or None where unavailable."""
    kib = read_proc_kib("/proc/self/status", "VmHWM:")
    return kib * 1024 if kib is not None else None


def _reset_host_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # Linux: reset VmHWM to the current resident size
    except OSError:
        pass


@contextlib.contextmanager
def preserved_state(*modules_and_optimizers: Any, generators: Sequence[torch.Generator] = ()) -> Iterator[None]:
    """Restore RNGs (the global ones and ``generators``), backend flags and the given models'/optimizers'
    state dicts on exit."""
    saved_rng = rng.capture(generators)
    flags = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    threads = torch.get_num_threads()  # Plan.intra_op_threads sets it process-wide
    saved = [(obj, copy.deepcopy(obj.state_dict())) for obj in modules_and_optimizers]
    try:
        yield
    finally:
        for obj, state in saved:
            obj.load_state_dict(state)
        torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        rng.restore(saved_rng, generators)


def _on_a_copy(
    trial: _Outcome,
    model: nn.Module,
    optimizer_fn: Callable[..., Any],
    plan: Plan,
    seed: int,
    body: Callable[[Runtime], None],
) -> None:
    """Run ``body(runtime)`` on a deep copy of ``model`` prepared under ``plan``, tracking peak memory.

    RNGs and backend flags are restored after; an exception (in ``prepare`` or in ``body``) is
    caught into ``trial.error``: a failing candidate is a result, not a crash.
    """
    work: nn.Module | None
    rt: Runtime | None
    with preserved_state():
        torch.manual_seed(seed)
        try:
            work = copy_for_trial(model)
            rt = prepare(
                work, optimizer_fn(work.parameters()), plan, on_skip=lambda name, why: trial.skipped.append((name, why))
            )
            trial.applied = list(rt.applied)
            if rt.device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(rt.device)
            else:
                _reset_host_peak()
            body(rt)
            trial.peak_memory_bytes = (
                torch.cuda.max_memory_allocated(rt.device) if rt.device.type == "cuda" else peak_host_memory()
            )
        except Exception as exc:  # noqa: BLE001 - a failing candidate is a result, not a crash
            trial.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # give back what the failed candidate held before the next one
        finally:
            work = rt = None  # free before returning


def run_trial(
    model: nn.Module,
    optimizer_fn: Callable[..., Any],
    loss_fn: Callable[..., Any] | None,
    batches: Sequence[Any],
    plan: Plan,
    steps: int = 10,
    warmup: int = 3,
    step_fn: Callable[..., Any] | None = None,
    seed: int = 0,
    loader: Iterable[Any] | None = None,
    give_up_s: float | None = None,
) -> Trial:
    """Train a deep copy of ``model`` for ``warmup + steps`` optimizer steps under ``plan``.

    ``batches`` are reused cyclically (``(inputs, targets)`` for ``loss_fn``, anything for
    ``step_fn(model, batch) -> loss``). Errors (out of memory, a compile failure) are caught
    and reported in ``Trial.error``; the caller's model, optimizer and RNGs are untouched.

    With ``loader`` (``batches`` is then ignored) every micro-batch comes from the loader rebuilt
    with the plan's loader switches and moved as the plan says (pinning, non_blocking, prefetch),
    so the data path is timed too; the loader starts over when it runs out.

    ``give_up_s``: a hopeless candidate is stopped (``Trial.stopped_early``, and ``Trial.error`` says
    why) as soon as :data:`HOPELESS_STEPS` steps from the second on (the first holds one-time costs;
    a compiled plan's steps from the first after the warm-up) have taken longer than that and than
    :data:`HOPELESS_FLOOR_S`.
    """
    if not batches and loader is None:
        raise ValueError("run_trial needs at least one batch (or a loader)")
    per_step = batch_size_of(batches[0]) * plan.grad_accum_steps if loader is None else 0  # loader: set below
    trial = Trial(plan=plan, samples_per_step=per_step)

    def steps_on(rt: Runtime) -> None:
        if loader is None:
            device_batches = [rt.to_device(b) for b in batches]

            def micro(i: int) -> Iterable[Any]:
                return _cycled(device_batches, i, rt.accum_steps)
        else:
            step_loader = rt.rebuild_loader(loader)  # once: persistent workers must outlive a pass
            stream = _endless(lambda: rt.device_batches(step_loader))
            first = next(stream)
            trial.samples_per_step = batch_size_of(first) * rt.accum_steps
            stream = itertools.chain([first], stream)

            def micro(i: int) -> Iterable[Any]:
                return itertools.islice(stream, rt.accum_steps)  # lazy: fetching is part of the step

        clock = StepClock(rt.device)
        warm_start = time.perf_counter()
        # Compiled plans are judged after their warm-up only: compiles and the recompile a second shape makes happen
        # there, and a later one (a last short batch) is one slow step, not the two that stop a trial.
        judged_from = 1 if plan.compile is False else max(1, warmup)
        faults_before = 0
        over: list[float] = []  # the judged steps that took longer than give_up_s
        losses: list[Any] = []
        for i in range(warmup + steps):
            if i == warmup:
                faults_before = minor_page_faults()
            clock.start(i)
            losses.append(_train_step(rt, micro(i), loss_fn, step_fn, read_loss=not clock.on_device))
            took = clock.finish(i)  # a GPU's previous step (the host runs one step ahead), else this one
            if i == warmup - 1:
                clock.drain()  # once: compile and warm-up work queued on the device counts as warm-up
                trial.warmup_s = time.perf_counter() - warm_start
            if give_up_s is not None and took is not None and took[0] >= judged_from:
                if took[1] > max(give_up_s, HOPELESS_FLOOR_S):
                    over.append(took[1])
                # Two slow steps, not one: a loaded machine can hold one sub-millisecond step back 0.2-1 s.
                if len(over) == HOPELESS_STEPS:
                    trial.error = (
                        f"stopped early: {HOPELESS_STEPS} steps took {' and '.join(f'{s:.3g}' for s in over)} s, "
                        f"over {give_up_s:.3g} s ({HOPELESS:g}x the baseline's step): it cannot be faster"
                    )
                    trial.stopped_early = True
                    clock.drain()
                    trial.losses = _as_floats(losses)
                    return
        trial.step_times_s = clock.durations(first=warmup)
        trial.losses = _as_floats(losses)
        if trial.step_times_s:
            trial.page_faults_per_step = (minor_page_faults() - faults_before) / len(trial.step_times_s)

    _on_a_copy(trial, model, optimizer_fn, plan, seed, steps_on)
    return trial


@dataclass
class EpochTrial(_Outcome):
    """Whole epochs through a loader, each timed from ``iter(loader)`` (worker start-up included) to its last step."""

    plan: Plan
    epoch_s: list[float] = field(default_factory=list)  # wall time of each epoch
    epoch_samples: list[int] = field(default_factory=list)
    epoch_steps: list[int] = field(default_factory=list)
    epoch_losses: list[list[float]] = field(default_factory=list)  # per optimizer step, each epoch
    reads: list[dict[str, int]] = field(default_factory=list)  # bytes per URL scheme read by tt.data, each epoch
    step_times_s: list[float] = field(default_factory=list)  # every step of every epoch, data wait included
    warmup_s: float = 0.0  # the warm-up steps before the first epoch

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.epoch_s) and all(self.epoch_samples)

    @property
    def samples_per_s(self) -> list[float]:
        """Throughput of each epoch: its samples over its wall time."""
        return [n / s if s > 0 else 0.0 for n, s in zip(self.epoch_samples, self.epoch_s)]


def run_epochs(
    model: nn.Module,
    optimizer_fn: Callable[..., Any],
    loss_fn: Callable[..., Any] | None,
    loader: Iterable[Any],
    plan: Plan,
    epochs: int = 2,
    warmup: int = 3,
    warmup_batches: Sequence[Any] = (),
    step_fn: Callable[..., Any] | None = None,
    seed: int = 0,
) -> EpochTrial:
    """Train a deep copy of ``model`` for ``epochs`` whole passes over ``loader`` under ``plan``.

    Where :func:`run_trial` times steady-state steps, this times what a data-bound run feels:
    the wall time of each epoch, from ``iter()`` (worker processes starting, unless the plan
    keeps them alive) to the last step. The loader is rebuilt once with the plan's loader
    switches, so ``persistent_workers`` carries its workers into the next epoch. ``warmup``
    steps on ``warmup_batches`` (cycled) run first, outside the epochs: compile and allocator
    warm-up stay out of epoch 1. A last step short of ``grad_accum_steps`` micro-batches is
    dropped. Reads the data layer does (``turbotrain.data.stats``: remote fetches, cache hits,
    local files) are counted per epoch. Errors land in ``EpochTrial.error``.
    """
    trial = EpochTrial(plan=plan)

    def epochs_on(rt: Runtime) -> None:
        resident = [rt.to_device(b) for b in warmup_batches]
        started = time.perf_counter()
        for i in range(warmup if resident else 0):
            _train_step(rt, _cycled(resident, i, rt.accum_steps), loss_fn, step_fn)
        trial.warmup_s = time.perf_counter() - started
        epoch_loader = rt.rebuild_loader(loader)  # once: persistent workers must outlive an epoch
        for _ in range(epochs):
            before = read_stats.snapshot()
            started = time.perf_counter()
            batches = iter(rt.device_batches(epoch_loader))
            losses, samples = [], 0
            while True:
                step_started = time.perf_counter()
                micro = list(itertools.islice(batches, rt.accum_steps))
                if len(micro) < rt.accum_steps:
                    break
                losses.append(_train_step(rt, micro, loss_fn, step_fn))
                samples += sum(batch_size_of(b) for b in micro)
                trial.step_times_s.append(time.perf_counter() - step_started)
            trial.epoch_s.append(time.perf_counter() - started)
            del batches  # a worker iterator that is not persistent has shut down by now
            reads = read_stats.snapshot() - before
            trial.reads.append({scheme: r.bytes for scheme, r in reads.schemes.items() if r.bytes})
            trial.epoch_samples.append(samples)
            trial.epoch_steps.append(len(losses))
            trial.epoch_losses.append(losses)
        # Returning drops the loader, which ends its workers (persistent ones too) before the next trial.

    _on_a_copy(trial, model, optimizer_fn, plan, seed, epochs_on)
    return trial


class StepClock:
    """Per-step times of a training loop, on the host's clock or, on a GPU, on the device's own.

    On a GPU an event is recorded on the compute stream as each step starts, and the host runs one
    step ahead of the device (it waits for a step's start marker only after queuing the next step):
    the device never idles for a per-step sync, as in a real training run, and a step's time is the
    stream's time from its marker to the next one, host stalls (data loading, launches) included.
    """

    def __init__(self, device: torch.device):
        self.on_device = device.type == "cuda"
        self._starts: list[Any] = []  # one per step: an event (GPU) or a perf_counter() reading
        self._host_times: list[float] = []

    def start(self, step: int) -> None:
        if self.on_device:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch leaves Event unannotated
            event.record()
            self._starts.append(event)
        else:
            self._starts.append(time.perf_counter())

    def finish(self, step: int) -> tuple[int, float] | None:
        """(step, seconds) of the latest step whose time is known now, or None."""
        if not self.on_device:
            self._host_times.append(time.perf_counter() - self._starts[step])
            return step, self._host_times[-1]
        if step == 0:
            return None
        self._starts[step].synchronize()  # step - 1 is done; step runs while the host queues step + 1
        return step - 1, self._starts[step - 1].elapsed_time(self._starts[step]) / 1e3

    def drain(self) -> None:
        """Wait for every step queued on the device."""
        if self.on_device:
            torch.cuda.current_stream().synchronize()

    def durations(self, first: int) -> list[float]:
        """Seconds per step from step ``first`` on (on a GPU, after waiting for the last)."""
        if not self.on_device:
            return self._host_times[first:]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch leaves Event unannotated
        end.record()
        end.synchronize()
        marks = [*self._starts, end]
        return [marks[i].elapsed_time(marks[i + 1]) / 1e3 for i in range(first, len(self._starts))]


def _as_floats(losses: list[Any]) -> list[float]:
    """Step losses as floats: device tensors read in one transfer at the end."""
    if not losses or not isinstance(losses[0], torch.Tensor):
        return [float(v) for v in losses]
    return [float(v) for v in torch.stack(losses).tolist()]


def minor_page_faults() -> int:
    """This process's minor page faults so far (pages the kernel mapped in on first touch): a step that
    counts thousands is paying for its allocator handing memory back to the system and taking it again."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else 0


def _train_step(
    rt: Runtime,
    micro_batches: Iterable[Any],
    loss_fn: Callable[..., Any] | None,
    step_fn: Callable[..., Any] | None,
    clear_grads_before_backward: bool = False,
    read_loss: bool = True,
) -> Any:
    """One optimizer step over ``rt.accum_steps`` micro-batches (taken from the iterable as they are
    needed, so fetching them is part of the step); returns the mean loss. The gradients are dropped after
    the optimizer step, or with ``clear_grads_before_backward`` between the first forward and its backward.

    ``read_loss=False`` returns the mean loss as a detached tensor and waits for no device (the caller
    reads it later); by default it is a float, read once per micro-batch and synchronized on a GPU."""
    loss_sum: Any = 0.0
    run_loss = rt.wrap_loss(loss_fn)
    for j, batch in enumerate(micro_batches):
        with rt.autocast():
            if step_fn:
                loss = step_fn(rt.model, batch)
            else:
                loss = run_loss(rt.model(batch[0]), batch[1])  # type: ignore[misc]  # callers pass one of the two
        if clear_grads_before_backward and j == 0:
            rt.clear_grads()
        with rt.no_sync(j + 1 < rt.accum_steps):
            rt.backward(loss / rt.accum_steps if rt.accum_steps > 1 else loss)
        # Read now, this is a host-device sync per micro-batch; unread, it is one more kernel on the device.
        loss_sum = loss_sum + (float(loss.detach()) if read_loss else loss.detach().float())
    for opt in rt.optimizers:
        rt.optimizer_step(opt, clear_grads=not clear_grads_before_backward)
    rt.end_step()
    if read_loss and rt.device.type == "cuda":
        torch.cuda.synchronize()
    return loss_sum / rt.accum_steps


def _cycled(batches: Sequence[Any], step: int, accum_steps: int) -> Iterator[Any]:
    """The micro-batches of optimizer step ``step`` when ``batches`` are reused cyclically."""
    return (batches[(step * accum_steps + j) % len(batches)] for j in range(accum_steps))


def _endless(make_epoch: Callable[[], Iterable[Any]]) -> Iterator[Any]:
    """Batches from ``make_epoch()``, started again each time an epoch runs out."""
    while True:
        empty = True
        for batch in make_epoch():
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader yields no batches (fewer samples than one batch with drop_last?)")


def time_loader(loader: Any, batches: int = 20, warmup: int = 2, **overrides: Any) -> float:
    """Batches per second a DataLoader delivers (with ``overrides`` such as ``num_workers=2``).

    Worker start-up is part of ``warmup``; only the loader is timed, no model runs.
    """
    from .data.loader import rebuild_loader

    loader = rebuild_loader(loader, **overrides) if overrides else loader
    it = iter(loader)
    try:
        for _ in range(warmup):
            next(it)
        started = time.perf_counter()
        done = 0
        for _ in range(batches):
            try:
                next(it)
            except StopIteration:
                break
            done += 1
        elapsed = time.perf_counter() - started
    finally:
        del it  # shut worker processes down now, not at garbage collection
    return done / elapsed if elapsed > 0 and done else 0.0
