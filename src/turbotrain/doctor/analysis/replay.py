"""Re-running the captured model: the surrogate training step, one timed call, the faster of two, a batch
made k times larger. Analysis (python_overhead) and the what-ifs both time the model this way."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ContextManager

import torch
from torch.utils._pytree import tree_map

from ...data.transfer import resize_batch, tensors_in
from ..record.measurements import ForwardFacts
from ..record.recording import Capture

if TYPE_CHECKING:
    from .context import Context

__all__ = [
    "surrogate_step",
    "autocast_of",
    "under",
    "script_loss",
    "time_once",
    "fastest_pair",
    "repeat_batch",
    "micro_step_s",
    "TwoWays",
    "step_two_ways",
]

ROUNDS = 3  # interleaved rounds of a step timed two ways (two where a step is long)
REPEATS = 3  # the fastest of up to this many steps each way, per round


def surrogate_step(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """Forward the captured ``(args, kwargs)``; the loss is the model's own where its forward returns one (a 0-dim
    output: nanoGPT's ``(logits, loss)``, a Hugging Face model given labels), else the mean square of the
    differentiable outputs."""
    args, kwargs = batch
    out = model(*args, **kwargs)
    outputs = [t for t in tensors_in(out) if t.is_floating_point() and t.requires_grad]
    if not outputs:
        raise ValueError("the model's output holds no differentiable tensor to build a loss from")
    # Its own loss, backward as the script's: a square of the logits beside it would add a backward through
    # batch x length x vocabulary that the script never runs (build-nanogpt's trials ran 2x its step).
    parts = [t.float() for t in outputs if t.dim() == 0] or [t.float().pow(2).mean() for t in outputs]
    return torch.stack(parts).sum() if len(parts) > 1 else parts[0]


def autocast_of(facts: ForwardFacts, on_gpu: bool) -> Callable[[], ContextManager[Any]]:
    """The autocast the script's training forward ran under (its dtype, on its device), for re-runs of its model: a
    bf16 script's model run in fp32 is other kernels, other graphs and twice the activations (build-nanogpt)."""
    dtype = getattr(torch, str(facts.autocast_dtype).rpartition(".")[2], None) if facts.autocast else None
    if not isinstance(dtype, torch.dtype):
        return contextlib.nullcontext
    device = "cuda" if on_gpu else "cpu"
    return lambda: torch.autocast(device, dtype=dtype)


def under(
    precision: Callable[[], ContextManager[Any]],
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] = surrogate_step,
) -> Callable[[torch.nn.Module, Any], torch.Tensor]:
    """``loss_fn`` with its forward under ``precision`` (the backward outside, as autocast asks)."""
    if precision is contextlib.nullcontext:
        return loss_fn

    def loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        with precision():
            return loss_fn(model, batch)

    return loss


def script_loss(facts: ForwardFacts, on_gpu: bool) -> Callable[[torch.nn.Module, Any], torch.Tensor]:
    """The re-runs' loss (:func:`surrogate_step`) with the forward under the script's autocast."""
    return under(autocast_of(facts, on_gpu))


def time_once(fn: Callable[[], object], cuda: bool) -> float:
    """Seconds for one call of ``fn``, the device's queued work included."""
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - started


def fastest_pair(a: Callable[[], object], b: Callable[[], object], cuda: bool, repeats: int) -> tuple[float, float]:
    """Seconds per call of ``a`` and ``b``, timed alternately, the fastest of ``repeats`` each (another
    process only ever adds time, and alternating spreads it over both)."""
    t_a = t_b = float("inf")
    for _ in range(repeats):
        t_a = min(t_a, time_once(a, cuda))
        t_b = min(t_b, time_once(b, cuda))
    return t_a, t_b


def repeat_batch(capture: Capture, k: int) -> tuple[Any, ...]:
    """The captured (args, kwargs) with every batch-sized tensor repeated ``k`` times along dim 0; an unbatched
    sample's tensors become ``k`` copies stacked on a new dim 0 (a batch of ``k`` such samples)."""
    if capture.unbatched:
        return tree_map(
            lambda t: torch.stack([t] * k) if isinstance(t, torch.Tensor) else t, (capture.args, capture.kwargs)
        )
    n = capture.batch_size
    return resize_batch((capture.args, capture.kwargs), n * k, rows=n, dim=capture.batch_dim)


def micro_step_s(ctx: Context) -> float:
    """The model's share of one of the script's steps (no data wait, no validation), for one micro-batch (a
    re-run steps one forward and backward of the captured batch; a step that accumulates k of them holds k) and
    its optimizer step."""
    passes = max(1.0, ctx.backwards_per_step())
    compute_s = (ctx.seconds("compute") + ctx.seconds("python_overhead")) / passes + ctx.seconds("optimizer")
    return max(1e-4, compute_s)


@dataclass(frozen=True)
class TwoWays:
    """The captured model's step timed as the script runs it and with a change, interleaved: per-round ratios
    (as is / changed) and each side's fastest seconds."""

    rounds: tuple[float, ...]
    as_is_s: float
    changed_s: float


def step_two_ways(
    ctx: Context, allows: Callable[[float], bool], change: Callable[[bool], ContextManager[Any]]
) -> TwoWays | None:
    """The captured model's surrogate step with ``change(False)`` (as the script runs it) and ``change(True)``
    entered around it, alternated in interleaved rounds; None without a captured model, or where the budget
    (``allows(seconds)``) cannot hold them. A long step is timed once per side and round, in two rounds."""
    capture = ctx.capture
    if capture is None:
        return None
    batch = (capture.args, capture.kwargs)

    def step(changed: bool) -> None:
        with change(changed):
            surrogate_step(capture.module, batch).backward()
        capture.module.zero_grad(set_to_none=True)

    model_s = micro_step_s(ctx)
    repeats = max(1, min(REPEATS, int(0.3 / model_s)))
    rounds = ROUNDS if repeats > 1 else 2
    if not allows((2 * rounds * repeats + 2) * model_s * 1.5 + 0.5):
        return None
    step(False)  # each way's first call warms its kernels and caches
    step(True)
    pairs = [fastest_pair(lambda: step(False), lambda: step(True), ctx.on_gpu, repeats) for _ in range(rounds)]
    return TwoWays(
        tuple(round(as_is / changed, 3) for as_is, changed in pairs if changed > 0),
        min(p[0] for p in pairs),
        min(p[1] for p in pairs),
    )
