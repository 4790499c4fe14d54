"""The words for what made torch.compile recompile, and the fix for each kind: the `compile-recompile` rule's, and
the `straggler` rule's for a rank late from its recompiles.

Not a rule (the leading ``_`` keeps it out of the rule registry).
"""

from __future__ import annotations

from ...findings import Fix
from ...record.compile_watch import CHANGED_VALUE, GRAD_MODE, NEW_DTYPE, NEW_INSTANCE, NEW_SHAPE

__all__ = ["kind_words", "fix_for"]

_WORDS = {
    NEW_SHAPE: "a new shape",
    NEW_DTYPE: "a new dtype",
    CHANGED_VALUE: "a changed Python value",
    NEW_INSTANCE: "another object",
    GRAD_MODE: "a call under torch.no_grad() (evaluation) of a graph compiled with grad, or back",
}
_OTHER = "another guard (requires_grad, device)"


def kind_words(kind: str) -> str:
    """What failed the guard, in words: "a new shape", "a changed Python value", ..."""
    return _WORDS.get(kind, _OTHER)


def fix_for(kind: str) -> Fix:
    """The fix for recompiles of ``kind``, in each framework."""
    if kind == NEW_SHAPE:
        text = (
            "torch.compile(model, dynamic=True), or torch._dynamo.mark_dynamic(x, dim) on the input whose length "
            "varies before the call; or pad the batches to a few bucket lengths (e.g. multiples of 64)"
        )
        return Fix(
            text,
            lightning="Pad in the DataLoader's collate_fn to a few bucket lengths, or compile the LightningModule "
            "with dynamic=True (torch.compile(model, dynamic=True) before Trainer.fit)",
            hf_trainer="TrainingArguments(group_by_length=True, torch_compile=True) and pad_to_multiple_of=64 in "
            "the data collator",
        )
    if kind == CHANGED_VALUE:
        text = (
            "Pass the number that changes as a tensor (torch.tensor(value)) instead of a Python int/float, or "
            "keep it fixed; torch specialises the graph on Python values"
        )
    elif kind == NEW_DTYPE:
        text = "Cast the inputs to one dtype before the compiled call (x.float() or x.to(torch.bfloat16))"
    elif kind == NEW_INSTANCE:
        text = "Compile one module and call it for every batch, rather than compiling or calling new instances"
    elif kind == GRAD_MODE:
        # One graph per grad mode, each compiled once: compile seconds, no cost per step after.
        text = (
            "Nothing per step: torch.compile keeps one graph for grad and one for no_grad, each compiled once. To "
            "save that compile, evaluate with the eager module (model._orig_mod for torch.compile(model))"
        )
        return Fix(
            text,
            lightning="Nothing per step (one graph per grad mode, each compiled once); to save that compile, call "
            "the eager module (self.net._orig_mod) in validation_step and test_step",
        )
    else:
        text = "Keep what the failed guard checks the same from call to call (requires_grad, device)"
    return Fix(text)
