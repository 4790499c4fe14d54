"""The edit kinds: each a function from the parsed file and the request to the file's new text (kind ``"rule"``: the
rule's own ``Rule.rewrite``)."""

from __future__ import annotations

from typing import Callable

from . import accumulate, attention, cadence, compiled_loss, keywords, kept_graph, recompute, statements
from ..cst_tools import Source
from .model import ByHand, EditRequest

__all__ = ["EDIT_KINDS", "apply_edit"]

EDIT_KINDS: dict[str, Callable[[Source, EditRequest], str]] = {
    "loader": keywords.loader,  # num_workers / persistent_workers / pin_memory
    "optimizer": keywords.optimizer,  # fused=True / foreach=True
    "zero_grad": keywords.zero_grad,  # set_to_none=True
    "conv_bias": keywords.conv_bias,  # bias=False before a BatchNorm
    "from_numpy": keywords.from_numpy,  # torch.from_numpy for torch.tensor(ndarray)
    "ddp": keywords.ddp,  # DistributedDataParallel's keywords (find_unused_parameters=False)
    "fsdp": keywords.fsdp,  # fully_shard(..., reshard_after_forward=False) on every call
    "threads": keywords.threads,  # torch.set_num_threads(N) per rank
    "inference_mode": statements.inference_mode,  # around validation run with autograd on
    "autocast": statements.autocast,  # around the forward and the loss
    "cudnn_benchmark": statements.cudnn_benchmark,  # after the imports
    "dynamo_config": statements.dynamo_config,  # torch._dynamo.config.<name> = <value> after the imports
    "compile": keywords.compile_call,  # torch.compile(..., dynamic=True)
    "cadence": cadence.periodic,  # validation / checkpoint every N steps
    "save_every": cadence.save_every,  # a per-step torch.save under a step test
    "sdpa": attention.sdpa,  # hand-written attention as one SDPA call
    "detach": kept_graph.detach_kept,  # .detach() on what a loop keeps across steps
    "checkpoint": recompute.checkpoint_calls,  # a block's call recomputed in the backward
    "micro_batches": accumulate.micro_batches,  # the forward through the backward once per micro-batch
    "compile_loss": compiled_loss.compile_loss,  # the loss compiled with the compiled model it is computed on
}


def apply_edit(text: str, request: EditRequest, name: str) -> str:
    """``text`` (the file ``name``) with ``request`` made; :class:`ByHand` when it cannot be made safely."""
    if request.kind == "rule":  # an edit only its rule makes lives in the rule's module
        from ..rules import by_id

        rewrite = by_id(request.rule).rewrite
        if rewrite is None:
            raise ValueError(f"{request.rule}: an edit of kind 'rule' but the rule has no rewrite")
        edit = rewrite
    else:
        try:
            edit = EDIT_KINDS[request.kind]
        except KeyError:
            raise ValueError(f"unknown edit kind {request.kind!r}; known: {', '.join(sorted(EDIT_KINDS))}") from None
    new = edit(Source(text, name), request)
    if new == text:
        raise ByHand(f"{request.where}: the edit changed nothing (already fixed?)")
    return new
