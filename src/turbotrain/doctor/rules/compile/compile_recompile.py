"""`compile-recompile`: torch.compile compiled the same code again for a new input, or hit its recompile limit.

Reads: run (torch.compile's own records, record/compile_watch.py; the rule table in docs/doctor.md).
One finding per compiled code that recompiled, at the user line whose call brought the new input: the guards
that failed, classified (a new shape, dtype, Python value or object), and the compile seconds they cost as torch
counted them, against the steps watched. A code that hit the recompile limit runs eagerly from then on: ``high``.
Nothing is timed: the seconds are torch's own count of what the run paid.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterator

from ...edits import PRECISION, ByHand, EditSpec
from ...findings import Finding, Fix
from ...record.compile_watch import CHANGED_VALUE, NEW_DTYPE, NEW_INSTANCE, NEW_SHAPE, CompiledCode, Recompile
from ..rule import Detect, Rule, register
from ._common import compile_calls, seconds_text, user_codes, user_recompiles

if TYPE_CHECKING:
    from ...analysis.context import Context

_WORDS = {
    NEW_SHAPE: "a new shape",
    NEW_DTYPE: "a new dtype",
    CHANGED_VALUE: "a changed Python value",
    NEW_INSTANCE: "another object",
}
_OTHER = "another guard (requires_grad, device, grad mode)"


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
    else:
        text = "Keep what the failed guard checks the same from call to call (requires_grad, device, grad mode)"
    return Fix(text)


def _kinds(recompiles: list[Recompile]) -> str:
    counts = Counter(r.kind for r in recompiles)
    return ", ".join(f"{n} for {_WORDS.get(kind, _OTHER)}" for kind, n in counts.most_common())


def _watched_s(ctx: Context) -> float:
    return ctx.step_s * len(ctx.measured_steps)


def _fallback_finding(ctx: Context, code: CompiledCode) -> Finding:
    fallback = code.fallback
    assert fallback is not None
    f = Finding(
        "compile-recompile",
        site=fallback.caller or code.site,
        category="python_overhead",
        message=(
            f"torch.compile hit its recompile limit ({fallback.limit}={fallback.value or '?'}) on {code.name}() "
            f"and runs it eagerly from then on: the rest of the run gets nothing from compile. The last guard that "
            f"failed: {fallback.guard} ({_WORDS.get(fallback.kind, _OTHER)})."
        ),
        fix=fix_for(fallback.kind),
        evidence={
            "code": code.name,
            "limit": fallback.limit,
            "limit_value": fallback.value,
            "guard": fallback.guard,
            "kind": fallback.kind,
            "recompiles": len(code.recompiles),
            "recompile_s": round(code.recompile_s, 3),
        },
    )
    f.provisional("high")
    f.note = "Raising torch._dynamo.config.recompile_limit only delays it: fix what changes between calls."
    return f


def recompiles(ctx: Context) -> Iterator[Finding]:
    for code in user_codes(ctx):
        if code.fallback is not None:
            yield _fallback_finding(ctx, code)
            continue
        kept = user_recompiles(code)
        if not kept:
            continue
        first = kept[0]
        kind = Counter(r.kind for r in kept).most_common(1)[0][0]
        seconds = sum(r.seconds for r in kept)
        watched = _watched_s(ctx)
        f = Finding(
            "compile-recompile",
            site=first.caller or first.site or code.site,
            category="python_overhead",
            message=(
                f"torch.compile compiled {code.name}() {len(kept)} more time(s) ({_kinds(kept)}): "
                f"{seconds_text(seconds)} of compiling"
                + (f", against {seconds_text(watched)} of the steps watched" if watched else "")
                + f". First failed guard: {first.guard}."
            ),
            fix=fix_for(kind),
            evidence={
                "code": code.name,
                "kind": kind,
                "recompiles": [
                    {
                        "id": r.compile_id,
                        "kind": r.kind,
                        "guard": r.guard,
                        "where": ctx.where(r.caller or r.site),
                        "seconds": round(r.seconds, 3),
                    }
                    for r in kept
                ],
                "recompile_s": round(seconds, 3),
                "first_compile_s": round(code.first_compile_s, 3),
            },
        )
        # A new length recompiles once, then torch makes the dimension dynamic: only repeats keep costing.
        repeated = sum(r.kind == NEW_SHAPE for r in kept) >= 2 or sum(r.kind == CHANGED_VALUE for r in kept) >= 2
        f.provisional("medium" if repeated else "low")
        f.note = "Paid again for every new input of this kind (compile seconds are torch's own count); " + (
            "these recompiles repeated: each new value costs another compile."
            if repeated
            else "after one recompile for a new length torch makes that dimension dynamic."
        )
        yield f


def edit(ctx: Context, f: Finding) -> EditSpec:
    """``dynamic=True`` in the script's one ``torch.compile(...)`` call, for recompiles on new shapes; the other
    kinds are a change of what the script passes."""
    if f.evidence["kind"] != NEW_SHAPE:
        raise ByHand(f"recompiles for {_WORDS.get(f.evidence['kind'], _OTHER)}: {f.fix.pytorch}")
    calls = compile_calls(ctx)
    if len(calls) != 1:
        where = ", ".join(index.site(call).where(ctx.base) for index, call in calls) or "none in the script's files"
        raise ByHand(f"torch.compile(..., dynamic=True) at the call that compiles {f.evidence['code']}() ({where})")
    index, call = calls[0]
    if any(k.arg == "dynamic" for k in call.keywords):
        raise ByHand(f"{index.site(call).where(ctx.base)} sets dynamic= already: {f.fix.pytorch}")
    # Kernels for symbolic shapes are other kernels: the loss within the numerics guard, not bitwise.
    return EditSpec(
        "compile",
        "torch.compile(..., dynamic=True)",
        params={"keywords": {"dynamic": True}},
        numerics=PRECISION,
        file=index.path,
        line=call.lineno,
    )


RULE = register(Rule("compile-recompile", detect=(Detect("runtime", recompiles),), edit=edit))
