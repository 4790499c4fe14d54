"""The memory fixes written into the training loop at its forward's line, which the memory rules share: micro-batches
(the forward through the backward once per micro-batch, the loss over their number) and bf16 autocast around the
forward and the loss."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...edits import PRECISION, ByHand, EditSpec

if TYPE_CHECKING:
    from ...analysis.context import Context

__all__ = ["LOOP_FIXES", "loop_edit", "micro_batch_count"]

LOOP_FIXES = ("micro-batches", "bf16-autocast")


def micro_batch_count(detail: str) -> int:
    """``k`` of a micro-batches fix's detail (``"4 x 256 rows"``)."""
    return int(detail.split(" x ")[0])


def loop_edit(ctx: Context, fix: str, detail: str, rows: int | None = None, why: str = "") -> EditSpec:
    """``fix`` (one of :data:`LOOP_FIXES`) as an edit of the training forward's line, for a batch of ``rows`` (the
    captured batch's by default); ``why`` ends its label. For memory: the finding states its cost in time."""
    capture = ctx.capture
    if capture is None or capture.site is None:
        raise ByHand(f"{fix} {detail}: the training forward's line is not known; make it by hand")
    file, line = capture.site.file, capture.site.line
    if fix == "micro-batches":
        k = micro_batch_count(detail)
        rows = capture.batch_size if rows is None else rows
        label = f"{k} micro-batches of {rows // k} rows, their gradients accumulated (loss / {k} each){why}"
        params: dict[str, Any] = {"k": k, "dim": capture.batch_dim}
        return EditSpec("micro_batches", label, params, PRECISION, file, line, purpose="memory")
    if fix == "bf16-autocast":
        label = f"torch.autocast({ctx.device!r}, dtype=torch.bfloat16) around the forward and loss{why}"
        params = {"device": ctx.device, "dtype": "bfloat16"}
        return EditSpec("autocast", label, params, PRECISION, file, line, purpose="memory")
    raise ValueError(f"{fix!r} is not a loop fix; loop fixes: {', '.join(LOOP_FIXES)}")
