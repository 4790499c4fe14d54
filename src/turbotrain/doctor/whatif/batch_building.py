"""A batch built one sample at a time, timed against the same batch built with one indexing op, on the
script's own data tensor (read from the module that built it, never written) at the batch size it trained with.

Only reads are made: the slice bounds are evaluated from literals and the module's integer variables (no code
of the script runs), the start indices are drawn in the range both builds accept, and the two batches must be
equal for the one-op build to be offered as the same batch.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

import torch

from ..analysis.batch_building import per_sample_build
from ..analysis.replay import fastest_pair
from ..findings import Finding
from ..requests import BatchBuildRequest
from ..results import BatchBuildResult
from .outcome import Note, Outcome, Projected
from .common import Budget

if TYPE_CHECKING:
    from ..analysis.context import Context

__all__ = ["batch_build_trial"]

PAIR_ROUNDS = 2  # fastest_pair's 7 alternations, held to the noise floor as two interleaved rounds


def _int_value(node: ast.expr, var: str, namespace: dict[str, Any]) -> int | None:
    """A slice bound with the loop variable at 0: sums and differences of literals and the module's ints."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id == var:
            return 0
        value = namespace.get(node.id)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        left, right = _int_value(node.left, var, namespace), _int_value(node.right, var, namespace)
        if left is None or right is None:
            return None
        return left + right if isinstance(node.op, ast.Add) else left - right
    return None


def _not_timed(why: str) -> Outcome:
    return Outcome(after=(Note(f"Not timed: {why}", at="after"),))


def batch_build_trial(ctx: Context, finding: Finding, budget: Budget) -> Outcome | None:
    request = finding.request
    assert isinstance(request, BatchBuildRequest)  # run_what_ifs passes only these
    build = per_sample_build(request.site)
    if build is None or build.data is None or build.start is None or build.stop is None or not budget.allows(1.0):
        return None
    namespace = (ctx.capture.namespaces if ctx.capture is not None else {}).get(request.site.file)
    if namespace is None:
        return _not_timed("the module that built the batch was not reachable after the run.")
    data = namespace.get(build.data)
    lo, hi = _int_value(build.start, build.var, namespace), _int_value(build.stop, build.var, namespace)
    rows = ctx.capture.batch_size if ctx.capture is not None else ctx.facts.batch_size
    if not isinstance(data, torch.Tensor) or data.dim() == 0 or lo is None or hi is None or hi <= lo or not rows:
        return _not_timed(f"`{build.data}` is not a module-level tensor with bounds read from integers.")
    low, high = max(0, -lo), data.shape[0] - hi + 1
    if high <= low:
        return None
    gen = torch.Generator().manual_seed(0)
    ix = torch.randint(low, high, (rows,), generator=gen)
    indices = ix if build.indices_tensor else ix.tolist()
    offsets = torch.arange(lo, hi)

    def per_sample() -> torch.Tensor:
        return torch.stack([data[i + lo : i + hi] for i in indices])

    def one_op() -> torch.Tensor:
        return data[ix[:, None] + offsets]

    with torch.no_grad():
        same = torch.equal(per_sample(), one_op())
        t_per, t_one = fastest_pair(per_sample, one_op, cuda=data.is_cuda, repeats=7)
    # The line's own time in the step is what the run measured there (caches cold after the training step; the
    # timing above is warm): the one-op build leaves t_one / t_per of it.
    share = request.share * max(0.0, 1.0 - t_one / t_per) if t_per > 0 else 0.0
    result = BatchBuildResult(
        per_sample_ms=round(t_per * 1e3, 3),
        one_op_ms=round(t_one * 1e3, 3),
        rows=rows,
        sample_shape=(hi - lo, *data.shape[1:]),
        data=build.data,
        same_batch=same,
        pair_ratio=round(t_per / t_one, 3) if t_one > 0 else 1.0,
        pair_rounds=PAIR_ROUNDS,
    )
    if not same:
        return _not_timed("the one-op batch differed from the per-sample one; the share above is the line's.")
    how = (
        f"Timed on your `{build.data}` ({rows} samples of {hi - lo}): built one sample at a time "
        f"{t_per * 1e3:.2f} ms, with one indexing op {t_one * 1e3:.3f} ms, the same batch; the gain is "
        "the line's measured share of the step less what the one-op build leaves of it."
    )
    return Outcome(Projected(result, share), after=(Note(how),))
