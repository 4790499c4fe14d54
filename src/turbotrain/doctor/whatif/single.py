"""What-ifs that time one part of the step two ways, alternately (a forward with and without
autograd, an attention by hand and fused), and hold that single comparison to the window's noise."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from ...measure import copy_for_trial
from ..findings import Finding
from ..requests import AttentionRequest, EvalGradRequest
from ..results import AttentionResult, EvalGradResult
from ..analysis.replay import fastest_pair
from .outcome import Note, Outcome, Projected, model_share, not_measured
from .common import Budget

if TYPE_CHECKING:
    from ..analysis.context import Context


def _pair_ratio(slow_s: float, fast_s: float) -> float:
    """The ratio :func:`cap_to_noise` judges (``pair_ratio``); :func:`fastest_pair`'s 7 alternations count as
    two interleaved rounds (``pair_rounds=PAIR_ROUNDS``)."""
    return round(slow_s / fast_s, 3) if fast_s > 0 else 1.0


PAIR_ROUNDS = 2


def _time_pair(
    slow: Callable[[], None], fast: Callable[[], None], cuda: bool, repeats: int = 7
) -> tuple[float, float] | Outcome:
    """:func:`fastest_pair` after one untimed call of each; why not, when one fails."""
    try:
        slow()
        fast()
        return fastest_pair(slow, fast, cuda, repeats)
    except Exception as exc:  # noqa: BLE001 - a model that cannot run this way: the finding stays estimated
        return Outcome(before=(Note(f"Not measured: {type(exc).__name__}: {exc}"),))


def eval_grad_trial(ctx: Context, finding: Finding, budget: Budget) -> Outcome | None:
    if ctx.capture is None or not budget.allows(2.0):
        return None
    model = copy_for_trial(ctx.capture.module).eval()
    # The validation forward's own inputs where they were seen (its batch is often larger than training's).
    args, kwargs = ctx.eval_grad_inputs or (ctx.capture.args, ctx.capture.kwargs)

    def forward(grad: bool) -> Callable[[], None]:
        def run() -> None:
            with torch.enable_grad() if grad else torch.inference_mode():
                model(*args, **kwargs)

        return run

    pair = _time_pair(forward(True), forward(False), cuda=ctx.device == "cuda")
    if isinstance(pair, Outcome):
        return pair
    with_grad, without = pair
    saving = max(0.0, 1.0 - without / with_grad) if with_grad > 0 else 0.0
    request = finding.request
    assert isinstance(request, EvalGradRequest)  # run_what_ifs passes only these
    result = EvalGradResult(
        forward_ms_with_grad=round(with_grad * 1e3, 3),
        forward_ms_inference_mode=round(without * 1e3, 3),
        pair_ratio=_pair_ratio(with_grad, without),
        pair_rounds=PAIR_ROUNDS,
    )
    return Outcome(Projected(result, request.share * saving))


def attention_trial(ctx: Context, finding: Finding, budget: Budget) -> Outcome | None:
    request = finding.request
    assert isinstance(request, AttentionRequest)  # run_what_ifs passes only these
    if not request.per_step or not budget.allows(3.0):
        return None
    first, last = request.lines
    softmax = ctx.stat_at("softmax", request.softmax)
    score_shape = softmax.detail.get("shape") if softmax else None
    shapes = [
        (site, s) for site, s in ctx.matmul_shapes.items() if site.file == request.file and first <= site.line <= last
    ]
    qk = next(
        (
            (a, b)
            for _, (a, b) in shapes
            if len(a) >= 3
            and len(b) >= 3
            and score_shape is not None
            and tuple(a[:-1]) + (b[-1],) == tuple(score_shape)
        ),
        None,
    )
    if qk is None or ctx.model is None:
        why = (
            "the attention's operand shapes were not seen during warm-up"
            if qk is None
            else "no model was seen training"
        )
        return Outcome(before=(not_measured(why, at="replace"),))
    (q_shape, kt_shape) = qk
    lead, length, dim, keys = q_shape[:-2], q_shape[-2], q_shape[-1], kt_shape[-1]
    device = ctx.device if ctx.device in ("cpu", "cuda") else "cpu"
    dtype = next(ctx.model.parameters()).dtype
    gen = torch.Generator(device="cpu").manual_seed(0)

    def make(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_()

    q, k, v = make(*lead, length, dim), make(*lead, keys, dim), make(*lead, keys, dim)
    causal = request.causal and length == keys
    mask = torch.ones(length, keys, dtype=torch.bool, device=device).triu(1) if causal else None

    def manual():
        scores = (q @ k.transpose(-2, -1)) * dim**-0.5
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        out = scores.softmax(-1) @ v
        out.sum().backward()

    def fused():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.sum().backward()

    pair = _time_pair(manual, fused, cuda=device == "cuda")
    if isinstance(pair, Outcome):
        return pair
    t_manual, t_fused = pair
    saved = request.per_step * max(0.0, t_manual - t_fused)
    share = min(saved / ctx.step_s, model_share(ctx)) if ctx.step_s else 0.0
    result = AttentionResult(
        q_shape=tuple(q_shape),
        keys=keys,
        causal=causal,
        manual_ms=round(t_manual * 1e3, 3),
        sdpa_ms=round(t_fused * 1e3, 3),
        calls_per_step=request.per_step,
        pair_ratio=_pair_ratio(t_manual, t_fused),
        pair_rounds=PAIR_ROUNDS,
    )
    how = (
        "Timed forward+backward at your attention's shapes, hand-written"
        + (" with a causal mask" if causal else "")
        + " against scaled_dot_product_attention."
    )
    return Outcome(Projected(result, share), after=(Note(how),))
