"""A rule's fix as an edit of the user's code: the typed spec a rule's edit planner returns, and why one cannot be
made (:class:`ByHand`). ``fixes/`` turns a spec into a diff (``fixes.table.EDIT_KINDS`` holds one function per
kind shared by several rules; kind ``"rule"`` is the rule's own ``Rule.rewrite``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .findings import LateCause

__all__ = [
    "EditSpec",
    "EditRequest",
    "EditKind",
    "Numerics",
    "Purpose",
    "ByHand",
    "EXACT",
    "PRECISION",
    "REINITIALISED",
    "RESAMPLED",
]

# How a fix relates to the original's numbers, which sets what "the losses match" means for it:
Numerics = Literal["exact", "precision", "reinitialised", "resampled"]
EXACT: Numerics = "exact"  # the same arithmetic: losses bitwise equal on the CPU
PRECISION: Numerics = "precision"  # lower precision or another kernel: within the numerics guard's tolerance
REINITIALISED: Numerics = "reinitialised"  # the same model family, other random draws at construction: not compared
RESAMPLED: Numerics = "resampled"  # other random draws every step (a fused kernel's own dropout masks): not compared

# What a fix is for, which sets what verifying it must show: a faster step, or a lower peak (at a cost in time the
# report states: such a fix stays in the patch when slower, never when it saves no memory).
Purpose = Literal["time", "memory"]

EditKind = Literal[
    "loader",  # num_workers / persistent_workers / pin_memory
    "optimizer",  # fused=True / foreach=True
    "zero_grad",  # set_to_none=True
    "conv_bias",  # bias=False before a BatchNorm
    "from_numpy",  # torch.from_numpy for torch.tensor(ndarray)
    "ddp",  # DistributedDataParallel's keywords
    "fsdp",  # fully_shard's keywords on every call
    "threads",  # torch.set_num_threads(N) per rank
    "inference_mode",  # around validation run with autograd on
    "autocast",  # around the forward and the loss
    "cudnn_benchmark",  # after the imports
    "dynamo_config",  # torch._dynamo.config.<name> = <value> after the imports
    "compile",  # torch.compile(..., dynamic=True)
    "cadence",  # validation / checkpoint every N steps
    "save_every",  # a per-step torch.save under a step test
    "sdpa",  # hand-written attention as one SDPA call
    "detach",  # .detach() on what a loop keeps across steps (a loss in a list, a running sum)
    "checkpoint",  # a block's call wrapped in torch.utils.checkpoint.checkpoint (recomputed in the backward)
    "micro_batches",  # the forward through the backward once per micro-batch, the loss over their number
    "compile_loss",  # a loss on a compiled model's output compiled with it, as one function
    "rule",  # the rule's own rewrite (Rule.rewrite, in the rule's module): an edit no other rule makes
]


class ByHand(Exception):
    """An edit that cannot be made safely on the source; the message says why, for the patch header."""


@dataclass(frozen=True)
class EditSpec:
    """One finding's fix as an edit: its kind, what it does in one line, and where (the finding's line unless
    ``file``/``line`` say otherwise; ``lines``: further lines the same fix edits). ``instead``: the edit to make where
    this one cannot be made on the source (a loop whose batch is made outside it takes no micro-batches)."""

    kind: EditKind
    label: str
    params: dict[str, Any] = field(default_factory=dict)
    numerics: Numerics = EXACT
    file: str | None = None
    line: int | None = None
    lines: tuple[int, ...] = ()
    purpose: Purpose = "time"
    # A memory fix: whether the step needs the memory it saves (False where it fits with room to spare, so the fix
    # would only cost time; the patch then leaves it out unless it is asked for by name).
    needed: bool = True
    instead: EditSpec | None = None


@dataclass(frozen=True)
class EditRequest:
    """One finding's fix as an edit of one file: which edit kind, at which lines, with which values."""

    rule: str
    kind: EditKind  # a key of fixes.table.EDIT_KINDS
    file: str  # absolute path of the file the edit changes
    line: int  # the line the finding names
    where: str  # ``train.py:26``, relative to the script's folder
    label: str  # what the edit does, one line
    numerics: Numerics = EXACT
    params: dict[str, Any] = field(default_factory=dict)
    lines: tuple[int, ...] = ()  # further lines the same fix edits (every conv a BatchNorm follows)
    predicted: float | None = None
    gain_share: float | None = None
    category: LateCause | None = None  # the breakdown category the finding's time is in (Finding.category)
    purpose: Purpose = "time"
    instead: EditRequest | None = None  # made where this edit cannot be
