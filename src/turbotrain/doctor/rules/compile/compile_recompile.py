"""`compile-recompile`: recompiles, the failed guard classified (new shape, dtype, Python value, object) at the line
that brought the new input, and their compile seconds; `high` when the recompile limit was hit and the code ran
eagerly since; new shapes timed: `dynamic=True` (fresh compile) against the model as the script runs it (compiled,
or eager after the limit), then stepped on the lengths the failed guards name, counting the graphs it compiles for
them.

Reads: run + model.
Edit: `dynamic=True` at the recompiling function's own `@torch.compile` (a bare one made a call), else in the
script's one `torch.compile(...)` call (replacing a `dynamic=False`), for recompiles on new shapes (by hand where the
script has several, for new tensor ranks, or for another guard).

One finding per compiled code that recompiled and user line whose call brought new inputs (the training call, the
evaluation's): the guards that failed, classified (a new shape, dtype, Python value, object or grad mode), and the
compile seconds they cost as torch counted them, against the steps watched; its fix the most frequent kind's, or for
new tensor ranks and for an attribute that is None until the first call, their own. A code that hit the recompile
limit runs eagerly from then on: ``high``. New shapes of the captured model are timed: ``dynamic=True`` (fresh
compile) against the model as the script runs it (compiled as the script compiles it, or eager after the limit) on
the captured batch, interleaved, and stepped on the other lengths the failed guards name, counting the graphs it
compiles for them.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch

from ...edits import ByHand, EditSpec
from ...findings import Evidence, Finding, Fix
from ...record.compile_watch import CHANGED_VALUE, GRAD_MODE, NEW_SHAPE, CompiledCode, Recompile
from ...requests import OwnTrial
from ..rule import Detect, Measured, Rule, TimeLeft, register
from ._common import (
    Batch,
    PairTiming,
    Variant,
    compile_decorator,
    compile_edit,
    compiled_model,
    eager_copy,
    is_forward_of,
    recompiled,
    script_dynamic,
    seconds_text,
    measured_pair,
    one_compile_call,
    trade_off,
    user_codes,
    user_recompiles,
)
from ._recompile_fix import fix_for, kind_words

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...sites import Site

# torch's text for a failed size guard: "tensor 'tokens' size mismatch at index 1. expected 16, actual 21"
_SIZE_GUARD = re.compile(
    r"tensor '(?P<name>.+?)' size mismatch at index (?P<index>\d+)\. expected (?P<expected>\d+), "
    r"actual (?P<actual>\d+)"
)
OTHER_LENGTHS = 4  # the lengths of the run's failed guards the dynamic compile steps on


@dataclass(frozen=True)
class RecompileRow(Evidence):
    id: str  # torch's compile id, "0/2"
    kind: str  # NEW_SHAPE, NEW_DTYPE, CHANGED_VALUE, NEW_INSTANCE or another (record/compile_watch.py)
    guard: str
    where: str | None
    seconds: float


@dataclass(frozen=True)
class RecompileEvidence(Evidence):
    code: str  # the compiled code's name
    code_at: str  # and its file:line (two modules' codes are both "forward")
    kind: str  # the kind most of its recompiles were for
    recompiles: tuple[RecompileRow, ...]
    recompile_s: float
    first_compile_s: float


@dataclass(frozen=True)
class LimitEvidence(Evidence):
    """The recompile limit hit: the code ran eagerly from then on."""

    code: str
    code_at: str
    limit: str  # "recompile_limit" or "accumulated_recompile_limit"
    limit_value: int
    guard: str  # the last failed guard
    kind: str  # and its kind
    recompiles: int
    recompile_s: float


def _evidence(f: Finding) -> RecompileEvidence | LimitEvidence:
    evidence = f.evidence
    assert isinstance(evidence, (RecompileEvidence, LimitEvidence))  # the rule makes one or the other
    return evidence


def _kinds(recompiles: list[Recompile]) -> str:
    counts = Counter(r.kind for r in recompiles)
    return ", ".join(f"{n} for {kind_words(kind)}" for kind, n in counts.most_common())


def _code_at(code: CompiledCode) -> str:
    """Which compiled code a finding is about: its file and first line (two modules' codes are both "forward")."""
    return f"{code.code.file}:{code.code.line}"


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
            f"failed: {fallback.guard} ({kind_words(fallback.kind)})."
        ),
        fix=fix_for(fallback.kind),
        evidence=LimitEvidence(
            code=code.name,
            code_at=_code_at(code),
            limit=fallback.limit,
            limit_value=fallback.value,
            guard=fallback.guard,
            kind=fallback.kind,
            recompiles=len(code.recompiles),
            recompile_s=round(code.recompile_s, 3),
        ),
    )
    f.provisional("high")
    f.note = "Raising torch._dynamo.config.recompile_limit only delays it: fix what changes between calls."
    f.request = _trial(ctx, fallback.kind, code)
    return f


def _trial(ctx: Context, kind: str, code: CompiledCode) -> OwnTrial | None:
    """A trial of ``dynamic=True`` where new shapes recompiled the captured model (``code`` is its forward, not a
    function of its own such as a compiled optimizer step) and it is not dynamic already."""
    model = compiled_model(ctx)
    if kind != NEW_SHAPE or model is None or script_dynamic(model) is True:
        return None
    # modded-nanogpt's Muon step recompiled: timing the model with dynamic=True says nothing of it.
    return OwnTrial() if is_forward_of(model, code) else None


def recompiles(ctx: Context) -> Iterator[Finding]:
    for code in user_codes(ctx):
        if code.fallback is not None:
            yield _fallback_finding(ctx, code)
            continue
        kept = user_recompiles(code)
        by_line: dict[Site | None, list[Recompile]] = {}
        for r in kept:
            by_line.setdefault(r.caller or r.site, []).append(r)
        # One finding per line that brought new inputs (one per rule and line is what the report keeps): each its
        # cause and fix (modded-nanogpt's forward recompiled four times for its evaluation under no_grad, and once,
        # at the training call, for a rotary cache filled on the first call).
        for rows in sorted(by_line.values(), key=len, reverse=True):
            yield _line_finding(ctx, code, rows, len(kept))


def _line_finding(ctx: Context, code: CompiledCode, kept: list[Recompile], of_code: int) -> Finding:
    """The recompiles of ``code`` one line brought (``of_code``: all of its recompiles)."""
    first = kept[0]
    kind = Counter(r.kind for r in kept).most_common(1)[0][0]
    seconds = sum(r.seconds for r in kept)
    watched = _watched_s(ctx)
    ranks = _ranks_only(kept)
    first_call = _filled_on_first_call(kept)
    settled = _settled_after(ctx, kept) if kind == CHANGED_VALUE and not first_call else None
    others = f"; {of_code - len(kept)} more at other lines, said apart" if of_code > len(kept) else ""
    f = Finding(
        "compile-recompile",
        site=first.caller or first.site or code.site,
        category="python_overhead",
        message=(
            f"torch.compile compiled {code.name}() {len(kept)} more time(s) ({_kinds(kept)}{others}): "
            f"{seconds_text(seconds)} of compiling"
            + (f", against {seconds_text(watched)} of the steps watched" if watched else "")
            + f". First failed guard: {first.guard.rstrip('.')}."
        ),
        fix=_line_fix(kept, kind, ranks, first_call, settled),
        evidence=RecompileEvidence(
            code=code.name,
            code_at=_code_at(code),
            kind=kind,
            recompiles=tuple(
                RecompileRow(
                    id=r.compile_id,
                    kind=r.kind,
                    guard=r.guard,
                    where=ctx.where(r.caller or r.site),
                    seconds=round(r.seconds, 3),
                )
                for r in kept
            ),
            recompile_s=round(seconds, 3),
            first_compile_s=round(code.first_compile_s, 3),
        ),
    )
    # A new length recompiles once, then torch makes the dimension dynamic: only repeats keep costing.
    repeated = sum(r.kind == NEW_SHAPE for r in kept) >= 2 or sum(r.kind == CHANGED_VALUE for r in kept) >= 2
    f.provisional("medium" if repeated and not ranks and settled is None else "low")
    f.note = _recompile_note(kind, ranks, settled is not None, repeated)
    f.request = _trial(ctx, kind, code)
    return f


def _line_fix(kept: list[Recompile], kind: str, ranks: bool, first_call: bool, settled: tuple[int, int] | None) -> Fix:
    """The fix for one line's recompiles: their own for new ranks, a cache filled on the first call and values all
    met early; else their most frequent kind's."""
    if ranks:
        return _RANKS_FIX
    if first_call:
        return _FIRST_CALL_FIX
    if settled is not None:
        return _values_fix(kept, *settled)
    return fix_for(kind)


def _recompile_note(kind: str, ranks: bool, settled: bool, repeated: bool) -> str:
    """What the recompiles cost over the run: once per graph, or again for every new input."""
    counted = "compile seconds are torch's own count"
    if ranks:
        return f"A graph per tensor rank, each compiled once ({counted})."
    if kind == GRAD_MODE:
        return f"A graph per grad mode, each compiled once ({counted})."
    if settled:
        return f"A graph per value met, each compiled once ({counted}); none recompiled in the steps measured after."
    paid = f"Paid again for every new input of this kind ({counted})"
    if repeated:
        return f"{paid}; these recompiles repeated: each new value costs another compile."
    if kind == NEW_SHAPE:
        return f"{paid}; after one recompile for a new length torch makes that dimension dynamic."
    return f"{paid}."


_FIRST_CALL_FIX = Fix(
    "The module fills this attribute on its first call (a cache that is None before it): fill it in __init__, or call "
    "the module once before compiling it, so that its graph is compiled against the value it keeps"
)


def _filled_on_first_call(recompiles: list[Recompile]) -> bool:
    """Recompiles on an attribute that was None the first time (``...rotary.seq_len_cached is None``)."""
    return all(r.kind == CHANGED_VALUE and r.guard.rstrip(". ").endswith(" is None") for r in recompiles)


# torch's text for a failed value guard: "L['red_dim'] == -2", "red_dim == -2", "self.flag == True"
_VALUE_GUARD = re.compile(r"^(?:L\['(?P<local>[^']+)'\]|(?P<name>[\w.\[\]']+)) == (?P<value>\S+)$")


def _settled_after(ctx: Context, recompiles: list[Recompile]) -> tuple[int, int] | None:
    """(the step the last of ``recompiles`` was paid in, the steps measured after it) where every one of them was
    paid before the measured steps: the values met were all met early, each compiled once; None where one was paid
    in the measured steps, or torch kept no start for one."""
    recording = ctx.recording
    facts = recording.compiled if recording is not None else None
    if recording is None or facts is None or not ctx.measured_steps:
        return None
    ids = {r.compile_id for r in recompiles}
    spans = [s for s in facts.spans if s.compile_id in ids]
    if {s.compile_id for s in spans} != ids:
        return None
    end = max(s.start + s.seconds for s in spans)
    first_measured = next((s for s in recording.steps if s.index == min(ctx.measured_steps)), None)
    paid_in = next((s.index for s in recording.steps if s.end >= end), None)
    if first_measured is None or paid_in is None or end > first_measured.start:
        return None
    return paid_in, len(ctx.measured_steps)


def _values_fix(recompiles: list[Recompile], step: int, measured: int) -> Fix:
    """Recompiles for a Python value that took a few values, all met by ``step``: a graph per value, compiled once
    each. "Pass it as a tensor" is no fix where the value picks a dimension or a branch (nanochat's ``red_dim``)."""
    guards = [m for m in (_VALUE_GUARD.match(r.guard.rstrip(". ")) for r in recompiles) if m is not None]
    names = {m["local"] or m["name"] for m in guards}
    values = list(dict.fromkeys(m["value"] for m in guards))
    what = f"{names.pop()} (the guards name {', '.join(values)})" if len(names) == 1 else "a Python value"
    return Fix(
        f"Nothing per step: the calls pass a few values of {what}, a graph compiled once for each by step {step}, "
        f"and none recompiled in the {measured} steps measured after. torch specialises on a value that picks a "
        "dimension, a branch or a shape, where a tensor would not serve; to compile fewer, call it with fewer values"
    )


_RANKS_FIX = Fix(
    "Nothing per step: the calls pass tensors of different ranks (1-D and 2-D), and a graph is compiled once for "
    "each; dynamic=True cannot make one graph serve two ranks. To compile fewer, call it with one rank only (stack "
    "or reshape the tensors alike)"
)


def _ranks_only(recompiles: Sequence[Recompile | RecompileRow]) -> bool:
    """Every recompile for a new tensor rank (nanochat's fused AdamW over its 1-D and 2-D parameters)."""
    return all("rank mismatch" in r.guard for r in recompiles)


def size_guards(recompiles: list[Recompile]) -> tuple[str, int, list[int]] | None:
    """From the failed size guards: the input torch named, the dimension that changed most often and the sizes
    the run met there, in the order met (the first guard's expected size first); None where no guard says."""
    found = [m for m in (_SIZE_GUARD.search(r.guard) for r in recompiles) if m is not None]
    if not found:
        return None
    index = Counter(int(m["index"]) for m in found).most_common(1)[0][0]
    on_index = [m for m in found if int(m["index"]) == index]
    name = re.sub(r"^L\['(.+)'\]$", r"\1", on_index[0]["name"])
    sizes = [int(on_index[0]["expected"])] + [int(m["actual"]) for m in on_index]
    return name, index, list(dict.fromkeys(sizes))


def _resized(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``t`` cut, or repeated and cut, to ``size`` along ``dim``: its own values, so token ids stay in range."""
    times = -(-size // t.shape[dim])
    return (torch.cat([t] * times, dim) if times > 1 else t).narrow(dim, 0, size).contiguous()


def other_lengths(model: torch.nn.Module, batch: Batch, name: str, dim: int, sizes: list[int]) -> list[Batch]:
    """The captured batch at each of ``sizes`` along ``dim``: every tensor argument of that length there is cut or
    extended with it (the input torch named and its companions, such as a mask); [] where the name is no argument."""
    args, kwargs = batch
    try:
        named = inspect.signature(model.forward).bind_partial(*args, **kwargs).arguments.get(name)
    except TypeError:
        return []
    if not isinstance(named, torch.Tensor) or named.dim() <= dim:
        return []
    length = named.shape[dim]

    def at(value: Any, size: int) -> Any:
        same = isinstance(value, torch.Tensor) and value.dim() > dim and value.shape[dim] == length
        return _resized(value, dim, size) if same else value

    return [
        (tuple(at(a, size) for a in args), {k: at(v, size) for k, v in kwargs.items()})
        for size in sizes
        if size != length
    ]


def edit(ctx: Context, f: Finding) -> EditSpec:
    """``dynamic=True`` in the script's one ``torch.compile(...)`` call, for recompiles on new shapes; the other
    kinds are a change of what the script passes."""
    evidence = _evidence(f)
    if evidence.kind == GRAD_MODE:
        raise ByHand("a graph per grad mode is compiled once each, not per step: nothing to edit")
    if evidence.kind != NEW_SHAPE:
        raise ByHand(f"recompiles for {kind_words(evidence.kind)}: {f.fix.pytorch}")
    if isinstance(evidence, RecompileEvidence) and _ranks_only(evidence.recompiles):
        raise ByHand("recompiles for new tensor ranks, which dynamic=True does not share a graph across")
    fix = "torch.compile(..., dynamic=True)"
    # The function's own @torch.compile where it has one, else the script's one torch.compile(...) call.
    index, call = compile_decorator(ctx, evidence.code_at) or one_compile_call(ctx, fix, f"{evidence.code}()")
    # dynamic=False (one graph per length) is the choice the fix reverses; any other value is the user's to change.
    if isinstance(call, ast.Call) and any(
        k.arg == "dynamic" and not (isinstance(k.value, ast.Constant) and k.value.value is False) for k in call.keywords
    ):
        raise ByHand(f"{index.site(call).where(ctx.base)} sets dynamic= already: {f.fix.pytorch}")
    return compile_edit(index, call, fix, {"dynamic": True})


def measure(ctx: Context, f: Finding, budget: TimeLeft) -> Measured | None:
    """The model as the script runs it (compiled, or eager after the limit) against ``dynamic=True``, interleaved
    on the captured batch; the dynamic compile also steps on the other lengths the run's guards name."""
    model = compiled_model(ctx)
    assert model is not None and ctx.capture is not None  # _trial asked only with a captured compiled model
    code = next(c for c in user_codes(ctx) if _code_at(c) == _evidence(f).code_at)
    fell_back = code.fallback is not None
    script = (
        Variant("eager, as the script runs after the recompile limit", eager_copy(model), compiles=False)
        if fell_back
        else Variant("compiled as the script compiles it", recompiled(model))
    )
    dynamic = Variant("compiled with dynamic=True", recompiled(model, dynamic=True))
    guards = size_guards(list(code.recompiles))
    batch = (ctx.capture.args, ctx.capture.kwargs)
    original = model._orig_mod
    assert isinstance(original, torch.nn.Module)  # compiled_model checked it
    others = other_lengths(original, batch, *guards[:2], guards[2])[:OTHER_LENGTHS] if guards else []
    paid_s = code.first_compile_s + code.recompile_s

    def say(timing: PairTiming, steps_differ: bool) -> str:
        return dynamic_note(timing, steps_differ, paid_s, len(code.recompiles), len(others), fell_back)

    # Not priced over the run from one batch: dynamic=True's compiling replaces the recompiles for other lengths.
    return measured_pair(ctx, budget, script, dynamic, say, code.first_compile_s, paid_s, others, over_run=False)


def dynamic_note(
    timing: PairTiming, step_differs: bool, paid_s: float, recompiles: int, others: int, fell_back: bool
) -> str:
    """What ``dynamic=True`` measured against the script's way, over the run: compile seconds and the step
    (``step_differs``: the rounds called the steps apart, beyond the noise)."""
    # Its compile: the first two calls less the step they include, and what the other lengths took beyond a step.
    dynamic_s = max(0.0, timing.warm_s[1] - 2 * timing.b_s) + sum(max(0.0, s - timing.b_s) for s in timing.other_s)
    lengths = f", and on {others} other length(s) the run met it compiled {timing.other_graphs} more graph(s)"
    said = (
        f"With dynamic=True: one compile of {seconds_text(dynamic_s)}{lengths if others else ''}; "
        f"a step {timing.b_s * 1e3:.2f} ms "
        f"against {timing.a_s * 1e3:.2f} ms as the script runs it. The script paid {seconds_text(paid_s)} compiling "
        f"this code ({recompiles} recompile(s))"
    )
    if fell_back:
        then = (
            "and ran it eagerly after the limit, which is slower than compiled with dynamic=True."
            if step_differs and timing.a_s > timing.b_s
            else "and ran it eagerly after the limit, which compiled with dynamic=True does not beat here."
        )
        return f"{said} {then}"
    if not step_differs:
        saved_s = paid_s - dynamic_s
        return f"{said}. The steps are alike within the noise: " + (
            f"dynamic=True saves {seconds_text(saved_s)} of compiling a run." if saved_s > 0 else "nothing to gain."
        )
    return f"{said}. " + trade_off(paid_s - dynamic_s, timing.a_s - timing.b_s, "compile with dynamic=True")


RULE = register(Rule("compile-recompile", detect=(Detect("runtime", recompiles),), measure=measure, edit=edit))
