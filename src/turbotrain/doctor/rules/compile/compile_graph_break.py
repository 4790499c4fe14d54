"""`compile-graph-break`: a script that compiles: each graph break at the user's line, torch's reason and how many
compiles met it, the fix by kind (`.item()`, a branch on a tensor, print/logging only where torch names the builtin
`print`, a `logging` or `warnings` call, or the line called into `logging`; an unsupported call; a break inside
torch's or a package's code the line runs, e.g. DDP's under `torch.compile(DistributedDataParallel(model))`, said as
that code's with the function it broke in, one finding a line; a break in a loop that ran the whole function
eagerly); `.item()` breaks timed: compiled as is against `capture_scalar_outputs=True`; `print` breaks timed:
compiled as is (its prints written nowhere) against `print` a no-op that torch traces; a branch on a tensor timed:
compiled as is against a copy of the model whose method computes the branch as one `torch.where` (each side sets one
name, or each returns) or as `torch.cond` (sides of several statements that change nothing outside themselves).

Reads: run (torch.compile's records).
Edit: `torch._dynamo.config.capture_scalar_outputs = True` after the script's imports, for its `.item()` breaks
(once: the flag is process-wide; other breaks are a rewrite, by hand).

Each break is one finding at the user's line, with torch's reason and how many compiles met it, and the fix by kind
of break: a print or a log only on evidence of one (torch names the builtin ``print``, a ``logging`` or ``warnings``
call, or the line called into ``logging``); a break inside torch's or a package's code is that code's (the function
it broke in, nothing at the user's line to move). A ``.item()`` break is timed: the script's model compiled as it is
against compiled with ``torch._dynamo.config.capture_scalar_outputs = True``, on its captured batch; a ``print``
break against the model compiled with ``print`` a no-op (which torch traces: the prints out of forward); a branch
on a tensor against a copy of the model with the branch as one ``torch.where`` where each side sets one name or each
returns, as ``torch.cond`` otherwise (:mod:`._branch_rewrite`); the other kinds are not.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Iterator, Literal, Sequence
from unittest import mock

import torch

from ...edits import PRECISION, ByHand, EditSpec
from ...findings import Evidence, Finding, Fix, one_line
from ...record.compile_watch import CompiledCode, GraphBreak
from ...requests import OwnTrial
from ...sites import Site, is_user_file
from ..rule import Detect, Measured, Rule, TimeLeft, register
from ._branch_cond import CondForm
from ._branch_rewrite import BranchForm, NotRewritten, form_at, why_not_rewritten, with_rewrite
from ._branch_where import WhereForm
from ._common import (
    PairTiming,
    Variant,
    compile_result,
    compile_seconds,
    compiled_like,
    compiled_model,
    eager_copy,
    is_item_break,
    measured_pair,
    recompiled,
    time_variants,
    user_breaks,
    user_codes,
)

if TYPE_CHECKING:
    from ...analysis.context import Context

# The kinds of break, from torch's title and reason.
BreakKind = Literal["item", "data-dependent-branch", "print-or-logging", "unsupported-call", "in-library"]
ITEM: Final = "item"
BRANCH: Final = "data-dependent-branch"
PRINT: Final = "print-or-logging"
UNSUPPORTED: Final = "unsupported-call"
LIBRARY: Final = "in-library"  # inside torch's or a package's code the user's line ran, not the line's own
_FLAG = "torch._dynamo.config.capture_scalar_outputs = True"
# What torch names as the call it could not trace when the user's line prints or logs: the builtin print, a
# logging.Logger's method (torch's own variable for one), warnings.warn. Torch's hints are left out: it suggests
# "a logging function (e.g. `print`)" for every builtin it cannot trace.
_PRINT_OR_LOG = re.compile(
    r"builtin (?:operator )?`?print\b|BuiltinVariable\(print\)"
    r"|logging\.Logger|LoggingLoggerVariable|\bLogger not supported|\b_?warnings\.warn\b"
)
_LOGGING = ("logging", "warnings")  # the standard library's: a break inside them is the line's log call


@dataclass(frozen=True)
class GraphBreakEvidence(Evidence):
    code: str  # the compiled code's name
    kind: BreakKind
    torch: str  # torch's title for the break
    gb_id: str
    compiles_met: int
    whole_function_eager: bool
    first_item: bool  # the first .item() break: its edit's flag keeps every one in the graph
    reason: str
    inside: str | None = None  # where torch broke in a library's code ("torch/nn/parallel/distributed.py:1757")
    where: str | None = None  # a branch as one torch.where, the statement its trial times ("h = torch.where(...)")
    cond: str | None = None  # a branch as torch.cond, the statements its trial times (two functions and the call)


def break_kind(b: GraphBreak) -> BreakKind:
    """ITEM, LIBRARY, BRANCH, PRINT or UNSUPPORTED for a break as torch words it and where it broke."""
    if is_item_break(b):  # the flag keeps a library's .item() in the graph too
        return ITEM
    if b.inside is not None and b.library not in _LOGGING:
        return LIBRARY
    said = "\n".join(line for line in f"{b.title}\n{b.reason}".splitlines() if not line.strip().startswith("Hint:"))
    text = said.lower()
    if "data-dependent" in text or "data dependent" in text or "generic_jump" in text:
        return BRANCH
    if b.inside is not None or _PRINT_OR_LOG.search(said):
        return PRINT
    return UNSUPPORTED


def _library_where(b: GraphBreak) -> str:
    """The library frame a break is in, from the library's own folder: "torch/nn/parallel/distributed.py:1757"."""
    if b.inside is None:
        return ""
    file = b.inside.file
    at = file.rfind(f"{os.sep}{b.library}{os.sep}") if b.library else -1
    return f"{file[at + 1 :] if at >= 0 else os.path.basename(file)}:{b.inside.line}"


def _module_of(code: CompiledCode) -> str:
    """The class of the compiled module a code of torch's own is named after ("" for the user's code)."""
    return code.name if code.name != code.code.function and not is_user_file(code.code.file) else ""


def _explanation(b: GraphBreak) -> str:
    """Torch's own sentence for what it could not trace ("Dynamo does not know how to trace method ...")."""
    line = next((line.strip() for line in b.reason.splitlines() if line.strip().startswith("Explanation:")), "")
    return line.removeprefix("Explanation:").strip().rstrip(".")


def _fix(kind: BreakKind, b: GraphBreak, code: CompiledCode, no_graph: bool, form: BranchForm | None) -> Fix:
    """The fix for a break of ``kind``, in each framework (the same code change in all: compile is the model's);
    ``form``: a branch's rewrite, said in full."""
    if kind == LIBRARY:
        owner = f"{b.library}'s" if b.library else "library"
        text = f"Nothing to change at this line (the break is inside {owner} code)"
        module = _module_of(code)
        if no_graph and module:
            text += (
                f". No graph was captured: compile the module of yours that {module} runs rather than {module} "
                f"itself (for a wrapper: {module}(torch.compile(model)), not torch.compile({module}(model)))"
            )
        elif no_graph:
            text += f". No graph was captured: compile code of your own, with the call into {owner} code outside it"
        else:
            text += (
                f"; your compiled code around it still runs as graphs: leave it, or keep the call into {owner} code "
                "outside the compiled region"
            )
    elif kind == ITEM:
        text = (
            "Keep the number a tensor (torch.where(...) or tensor arithmetic instead of .item()); or set "
            f"{_FLAG} before compiling, so the value stays in the graph"
        )
    elif kind == BRANCH and isinstance(form, WhereForm):
        text = f"Replace the Python `if` on a tensor with `{form.code()}` (both sides computed)"
    elif kind == BRANCH and isinstance(form, CondForm):
        text = f"Replace the Python `if` on a tensor with torch.cond (only the side taken runs):\n{form.code()}"
    elif kind == BRANCH:
        text = (
            "Replace the Python `if` on a tensor with torch.where(cond, a, b) (both sides computed) or torch.cond("
            "pred, true_fn, false_fn, operands)"
        )
    elif kind == PRINT:
        text = "Move the print/logging out of forward (log the returned tensors after the step, every N steps)"
    else:
        text = f"Move the call out of the compiled forward, or wrap it in a torch.library custom op (torch: {b.title})"
    lightning = f"{text} (in the LightningModule's forward; Lightning compiles it the same way)"
    return Fix(text, lightning=lightning, fabric=text, accelerate=text, hf_trainer=text)


def _met(b: GraphBreak) -> str:
    return f"{b.count} compile(s) met it{', ' + b.gb_id if b.gb_id else ''}"


def _in_library(b: GraphBreak, kind: BreakKind) -> str:
    """A break in a library's code, said from the user's line: the function it broke in and torch's words."""
    what = "reads a tensor's value into Python (.item())" if kind == ITEM else "calls what torch.compile cannot trace"
    explained = _explanation(b)
    function = b.inside.function if b.inside is not None else ""
    return (
        f"{function}() ({_library_where(b)}), which {what} (torch: {b.title}"
        f"{': ' + explained if explained else ''}; {_met(b)})"
    )


def _message(code: CompiledCode, b: GraphBreak, kind: BreakKind, no_graph: bool, also: Sequence[GraphBreak]) -> str:
    """What the break is; ``also``: the other breaks in library code that the same line runs."""
    if b.inside is not None and kind != PRINT:
        owner = f"{b.library}'s" if b.library else "library"
        said = (
            f"torch.compile ends the graph of {code.name}() inside {owner} code, not at a line of the script: this "
            f"line runs {', and '.join(_in_library(x, kind) for x in (b, *also))}. "
        )
    else:
        what = {
            ITEM: "reads a tensor's value into Python (.item())",
            BRANCH: "branches in Python on a tensor's value",
            PRINT: "prints or logs inside the compiled region",
            UNSUPPORTED: "calls something torch.compile cannot trace",
        }[kind]
        said = f"torch.compile ends the graph of {code.name}() here: the line {what}. Torch: {b.title} ({_met(b)}). "
    if b.skipped:
        return said + (
            "Torch could not resume after it (a break inside a loop) and ran the whole enclosing function eagerly, "
            "compiling only what it calls: most of the forward runs as plain Python."
        )
    if no_graph:
        return said + "torch.compile captured no graph in this run: the model ran eagerly, op by op."
    return said + "Each step runs the graph before it, this line as Python, then a new graph."


def is_print_break(b: GraphBreak) -> bool:
    """A break on the builtin ``print``, which a trial can take out of the graph (a no-op print traces)."""
    return "builtin operator `print`" in b.reason or "builtin `print`" in b.reason


def _branch_form(ctx: Context, site: Site | None) -> BranchForm | str | None:
    """The branch at a data-dependent break's line as one ``torch.where`` or as ``torch.cond``, or why neither; None
    where the line is no ``if`` of a function in the script's sources."""
    index = ctx.sources.get(site.file) if site is not None else None
    return form_at(index, site.line) if index is not None and site is not None else None


def graph_breaks(ctx: Context) -> Iterator[Finding]:
    item_seen = False  # the flag keeps every .item() in the graph at once: one trial and one edit answer them all
    print_seen = False  # one trial takes every print out of the forward at once
    no_graph = ctx.compiled is not None and ctx.compiled.graphs == 0
    for code in user_codes(ctx):
        breaks = user_breaks(code)
        # The breaks in library code one line runs: one finding for them all (one per rule and line is kept).
        in_library: dict[Site | None, list[GraphBreak]] = {}
        for b in breaks:
            if break_kind(b) == LIBRARY:
                in_library.setdefault(b.site, []).append(b)
        for b in breaks:
            kind = break_kind(b)
            also = in_library[b.site][1:] if kind == LIBRARY else []
            if kind == LIBRARY and b is not in_library[b.site][0]:
                continue
            first_item = kind == ITEM and not item_seen
            item_seen = item_seen or kind == ITEM
            first_print = kind == PRINT and is_print_break(b) and not print_seen
            print_seen = print_seen or first_print
            read = _branch_form(ctx, b.site) if kind == BRANCH else None
            form = None if isinstance(read, str) else read
            model = compiled_model(ctx)
            unwritable = read if isinstance(read, str) else None  # why the source's shape cannot be rewritten
            if form is not None and model is not None and b.site is not None:
                unwritable = why_not_rewritten(model._orig_mod, b.site, form)  # type: ignore[arg-type]  # checked a Module
            timed = (first_item or first_print or (form is not None and not unwritable)) and model is not None
            f = Finding(
                "compile-graph-break",
                site=b.site,
                category="python_overhead",
                message=_message(code, b, kind, no_graph, also),
                fix=_fix(kind, b, code, no_graph, form),
                evidence=GraphBreakEvidence(
                    code=code.name,
                    kind=kind,
                    torch=b.title,
                    gb_id=b.gb_id,
                    compiles_met=b.count,
                    whole_function_eager=b.skipped,
                    first_item=first_item,
                    reason=b.reason,
                    inside=f"{_library_where(b)} in {b.inside.function}" if b.inside is not None else None,
                    where=form.code() if isinstance(form, WhereForm) else None,
                    cond=form.code() if isinstance(form, CondForm) else None,
                ),
                request=OwnTrial() if timed else None,
            )
            # Not timed: what is known sets it, a whole function run eagerly above a break between graphs.
            f.provisional("medium" if b.skipped or kind == ITEM else "low")
            f.note = (
                "Unmeasured: what the break costs depends on the graphs around it; the fix is timed for .item() "
                "and print breaks, and for a branch on a tensor, as torch.where or torch.cond."
                + (f" This branch is not timed: {unwritable}." if unwritable else "")
            )
            yield f


def _scalars_captured() -> object:
    import torch._dynamo

    return torch._dynamo.config.patch(capture_scalar_outputs=True)


@contextlib.contextmanager
def _printing() -> Iterator[None]:
    """The script's prints, written to nowhere: the trial's rounds would fill the user's terminal."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        yield


@contextlib.contextmanager
def _prints_out() -> Iterator[None]:
    """``print`` as a function that does nothing: torch.compile traces it, so no graph ends there (what moving
    the prints out of forward gives)."""

    def nothing(*args: object, **kwargs: object) -> None:
        return None

    with _printing(), mock.patch.object(builtins, "print", nothing):
        yield


def _measure_prints(ctx: Context, budget: TimeLeft, model: torch.nn.Module) -> Measured | None:
    """The model compiled as it is (printing to nowhere) against compiled with its prints taken out."""
    as_is = Variant("compiled as the script compiles it (prints to nowhere)", recompiled(model), _printing)
    fixed = Variant("compiled with the prints out of forward", recompiled(model), _prints_out)

    def say(timing: PairTiming, _steps_differ: bool) -> str:
        return (
            f"Timed on the captured batch: {timing.a_s * 1e3:.2f} ms a step compiled as it is (its prints written "
            f"nowhere), {timing.b_s * 1e3:.2f} ms with print a no-op torch traces, so no graph ends there (fresh "
            "compiles of each, interleaved)."
        )

    return measured_pair(ctx, budget, as_is, fixed, say, compile_seconds(ctx)[0])


def _refusal(exc: BaseException) -> str:
    """Torch's own sentence for why it refused (its "Explanation:" line), else the error's first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    explained = next((line for line in lines if line.startswith("Explanation:")), "")
    if explained:
        return explained.removeprefix("Explanation:").strip().rstrip(".")
    # torch.cond's own refusal names what stopped it on the line after this one
    after = next((lines[i + 1] for i, line in enumerate(lines[:-1]) if line.endswith("Got graph break/error:")), "")
    return f"{lines[0].rstrip('.:')}: {after}" if after else one_line(exc).rstrip(".")


def _measure_branch(ctx: Context, f: Finding, budget: TimeLeft, model: torch.nn.Module) -> Measured | None:
    """The model compiled as it is against a copy whose method has the branch as one ``torch.where`` or as
    ``torch.cond``. A rewrite torch.compile refuses (``torch.cond`` takes tensors only) is said in the note."""
    form = _branch_form(ctx, f.site)
    if form is None or isinstance(form, str) or f.site is None:
        return None
    try:
        rewritten = with_rewrite(eager_copy(model), f.site, form)
    except NotRewritten:
        return None  # detection said why (why_not_rewritten): the source changed since, at most
    as_is = Variant("compiled as the script compiles it", recompiled(model))
    fixed = Variant(f"compiled with the branch as {form.label}", compiled_like(model, rewritten))
    if isinstance(form, WhereForm):
        written = f"`{form.code()}` in place of the `if` (both sides computed"
    else:
        written = (
            "the branch as torch.cond (as the fix writes it; only the side taken runs, and the other side's "
            "parameters get zero gradients, not None, so momentum and weight decay still move them"
        )

    def say(timing: PairTiming, _steps_differ: bool) -> str:
        return (
            f"Timed on the captured batch: {timing.a_s * 1e3:.2f} ms a step compiled as it is, "
            f"{timing.b_s * 1e3:.2f} ms with {written}, no graph break; fresh compiles of each, interleaved)."
        )

    try:
        return measured_pair(ctx, budget, as_is, fixed, say, compile_seconds(ctx)[0])
    except Exception as exc:  # noqa: BLE001 - torch.compile refusing the rewrite is a finding's note, not a crash
        f.note = f"{f.note or ''} Timed as {form.label}, the rewrite did not compile: {_refusal(exc)}.".strip()
        return None


def measure(ctx: Context, f: Finding, budget: TimeLeft) -> Measured | None:
    """The script's model compiled as it is against compiled with the break's fix (capture_scalar_outputs=True
    for ``.item()``; print taken out for prints; a branch as one ``torch.where``), interleaved."""
    from ....measure import judge

    model = compiled_model(ctx)
    facts = ctx.compiled
    if model is None or facts is None:
        return None
    kind = f.evidence_as(GraphBreakEvidence).kind
    if kind == PRINT:
        return _measure_prints(ctx, budget, model)
    if kind == BRANCH:
        return _measure_branch(ctx, f, budget, model)
    as_is = Variant("compiled as the script compiles it", recompiled(model))
    fixed = Variant(f"compiled with {_FLAG}", recompiled(model), _scalars_captured)  # type: ignore[arg-type]  # a config patch is a context manager
    timing = time_variants(ctx, budget, as_is, fixed, compile_seconds(ctx)[0])
    if timing is None:
        return None
    verdict = judge(list(timing.ratios), noise_floor=ctx.noise_floor)
    return Measured(
        what_if=compile_result(as_is, fixed, timing, timing.warm_s[1]),
        verdict=verdict,
        applies_to=ctx.share("compute") + ctx.share("python_overhead"),
        fix=Fix(
            f"{_FLAG} before torch.compile (the .item() value stays in the graph; code that branches on it "
            "still breaks: use torch.where there)",
            lightning=f"{_FLAG} before Trainer.fit (Lightning compiles the module with torch.compile)",
            fabric=f"{_FLAG} before fabric.setup(model)",
            accelerate=f"{_FLAG} before accelerator.prepare(model)",
            hf_trainer=f"{_FLAG} before Trainer(...) with torch_compile=True",
        ),
        note=(
            f"Timed on the captured batch: {timing.a_s * 1e3:.2f} ms a step compiled as it is, "
            f"{timing.b_s * 1e3:.2f} ms with capture_scalar_outputs (fresh compiles of each, interleaved)."
        ),
    )


def edit(ctx: Context, f: Finding) -> EditSpec:
    """The flag after the script's imports, once for every ``.item()`` break (it is process-wide); other breaks
    are a rewrite of the user's code."""
    evidence = f.evidence_as(GraphBreakEvidence)
    if evidence.kind == LIBRARY:
        raise ByHand(f"a break in a library's code ({evidence.inside}), not the script's: {f.fix.pytorch}")
    if evidence.kind == BRANCH and evidence.where is not None:
        raise ByHand(f"the branch as `{evidence.where}` (both sides computed; the trial timed it), written by hand")
    if evidence.kind == BRANCH and evidence.cond is not None:
        raise ByHand("the branch as torch.cond, as the fix writes it out (the trial timed it), written by hand")
    if evidence.kind != ITEM:
        raise ByHand(f"a break that {evidence.kind} is a change of the code itself: {f.fix.pytorch}")
    if not evidence.first_item:
        raise ByHand(f"{_FLAG}, set for the first .item() break, keeps this one in the graph too")
    if ctx.script is None:
        raise ByHand("the doctor did not run a script file to put the flag in")
    # Other graphs can fuse other kernels: the loss within the numerics guard, not bitwise.
    return EditSpec(
        "dynamo_config",
        _FLAG,
        params={"name": "capture_scalar_outputs", "value": True},
        numerics=PRECISION,
        file=ctx.script,
        line=0,
    )


RULE = register(Rule("compile-graph-break", detect=(Detect("runtime", graph_breaks),), measure=measure, edit=edit))
