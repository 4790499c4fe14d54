"""`compile-nothing`: a module the script compiled in place (``model.compile()``) of which torch compiled nothing in
the run: every frame its call runs is torch's own code (an ``nn.Sequential`` of torch's layers), which Dynamo
skips, so the model ran eagerly; ``model = torch.compile(model)`` traces it from outside. Timed: the model as it ran
against the model so compiled, over the run's length where it is known.

Reads: run + model + source.
Edit: `model.compile(...)` becomes `model = torch.compile(model, ...)`.

``Module.compile()`` compiles the module's ``_call_impl``; torch 2.13 skips every frame of torch's own module code,
so where the module's forward and all its children's are torch's too, no frame is left to compile (0 graphs, no
error, no warning). ``torch.compile(module)`` wraps the call from outside and traces it, torch's modules included.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch

from ....measure import copy_for_trial
from ...edits import PRECISION, ByHand, EditSpec
from ...findings import Evidence, Finding, Fix
from ...requests import OwnTrial
from ..rule import Detect, Measured, Rule, TimeLeft, register
from ._common import Variant, compile_result, seconds_text, time_variants, user_codes
from .compile_pays_back import RUN_UNIT, run_length

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...analysis.source import SourceIndex
    from ...cst_tools import Source
    from ...edits import EditRequest

# What a first compile of a small model costs here, for the budget to hold one before it is timed (nothing of the
# run compiled to say better).
GUESS_COMPILE_S = 3.0


@dataclass(frozen=True)
class NothingEvidence(Evidence):
    module: str  # the class of the module compiled in place
    path: str  # its name in the model ("": the model itself)
    receiver: str  # the expression the script calls .compile() on ("" where the call was not found in its files)


def in_place_compiled(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules of ``model`` compiled in place (``module.compile()`` set their compiled call), by name."""
    return [(name, m) for name, m in model.named_modules() if getattr(m, "_compiled_call_impl", None) is not None]


def compile_statements(ctx: Context) -> list[tuple[SourceIndex, ast.Call, str]]:
    """The ``x.compile(...)`` statements of the script's files whose result is dropped (a module compiled in place;
    ``re.compile`` or ``torch.compile`` on a module the file imports is not one), with ``x`` as written."""
    found = []
    for index in ctx.sources.values():
        modules = {
            alias.asname or alias.name.split(".")[0]
            for node in ast.walk(index.tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        }
        for node in ast.walk(index.tree):
            call = node.value if isinstance(node, ast.Expr) else None
            if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
                continue
            head = call.func.value
            while isinstance(head, ast.Attribute):
                head = head.value
            if call.func.attr == "compile" and not (isinstance(head, ast.Name) and head.id in modules):
                found.append((index, call, ast.unparse(call.func.value)))
    return found


def compiled_nothing(ctx: Context) -> Iterator[Finding]:
    if ctx.capture is None or user_codes(ctx):
        return
    compiled = in_place_compiled(ctx.capture.module)
    if not compiled:
        return
    path, module = compiled[0]
    statements = compile_statements(ctx)
    receiver = statements[0][2] if len(statements) == 1 else ""
    site = statements[0][0].site(statements[0][1]) if len(statements) == 1 else ctx.capture.site
    said = f"`{receiver}.compile()`" if receiver else f"`.compile()` on the model{f' ({path})' if path else ''}"
    target = receiver or ("model" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in path.split(".") if p))
    cls = type(module).__name__
    f = Finding(
        "compile-nothing",
        site=site,
        category="compute",
        message=(
            f"{said} compiled nothing: a call of {cls} runs only torch's own module code (its forward and its "
            "layers'), every frame of which torch.compile skips, so torch compiled no graph in this run and the "
            f"model ran eagerly. torch.compile({target}) traces the call from outside, torch's modules included."
        ),
        fix=Fix(
            f"`{target} = torch.compile({target})` in place of `{target}.compile()`",
            lightning=f"`self.{path or 'model'} = torch.compile(self.{path or 'model'})` in configure_model, "
            "not .compile() on it",
            hf_trainer="TrainingArguments(torch_compile=True), not .compile() on the model",
        ),
        evidence=NothingEvidence(module=cls, path=path, receiver=receiver),
        # First, before the plan's trials: what compiling would buy leads the report of a script that believes it
        # compiles.
        request=OwnTrial(first=True),
    )
    f.provisional("medium")
    f.note = "Unmeasured: the what-ifs time the model compiled with torch.compile against the eager step it ran."
    yield f


def measure(ctx: Context, f: Finding, budget: TimeLeft) -> Measured | None:
    """The model as it ran (its skipped compile in place) against a copy compiled with ``torch.compile``."""
    from ....measure import judge

    assert ctx.capture is not None  # the detector checked it
    ran = copy_for_trial(ctx.capture.module)
    fixed = copy_for_trial(ctx.capture.module)
    for _, module in in_place_compiled(fixed):
        module._compiled_call_impl = None  # the fix's copy is compiled from outside only
    as_ran = Variant("as it ran (compiled in place: nothing compiled)", ran, compiles=False)
    # torch.compile is typed for functions; given a Module it returns an OptimizedModule, a Module.
    compiled = Variant("torch.compile(model)", torch.compile(fixed))  # type: ignore[arg-type]  # a Module in, out
    timing = time_variants(ctx, budget, as_ran, compiled, GUESS_COMPILE_S)
    if timing is None:
        return None
    eager_s, compiled_s = timing.a_s, timing.b_s
    compile_s = max(0.0, timing.warm_s[1] - 2 * compiled_s)  # its first calls, less the step the second one was
    ratios, applies_to = list(timing.ratios), ctx.share("compute") + ctx.share("python_overhead")
    length = run_length(ctx)
    said_run = ""
    if length is not None:
        # The whole run as it ran against compiled: each step shorter (or longer) by what the model's step changed,
        # plus compiling once.
        steps, step_s = length.steps, ctx.step_s
        ratios = [steps * step_s / (compile_s + steps * (step_s - eager_s * (1 - 1 / r))) for r in ratios]
        applies_to = 1.0
        said_run = f" The ratio is the run's: {steps:,} steps and compiling once."
    verdict = judge(ratios, noise_floor=ctx.noise_floor)
    step = (
        f"{compiled_s * 1e3:.2f} ms a step compiled against {eager_s * 1e3:.2f} ms as it ran, after "
        f"{seconds_text(compile_s)} of compiling."
    )
    if compiled_s < eager_s:
        note = f"torch.compile(model) timed on the captured batch: {step}{said_run}"
        fix = None
    else:
        evidence = f.evidence_as(NothingEvidence)
        target = evidence.receiver or "model"
        note = (
            f"torch.compile(model) timed on the captured batch: {step} Compiling does not pay here: drop "
            f"`{target}.compile()`, which compiles nothing.{said_run}"
        )
        fix = Fix(f"Drop `{target}.compile()`: it compiles nothing, and compiling the model is slower here")
    result = compile_result(as_ran, compiled, timing, compile_s)
    return Measured(
        what_if=dataclasses.replace(result, run_steps=length.steps if length is not None else None),
        verdict=verdict,
        applies_to=applies_to,
        fix=fix,
        note=note,
        unit=RUN_UNIT if length is not None else "model's step time",
    )


def edit(ctx: Context, f: Finding) -> EditSpec:
    evidence = f.evidence_as(NothingEvidence)
    if not evidence.receiver:
        raise ByHand("no one `.compile()` statement in the script's files: compile the model with torch.compile")
    target = evidence.receiver
    return EditSpec("rule", f"{target} = torch.compile({target})", params={"target": target}, numerics=PRECISION)


def rewrite(source: Source, req: EditRequest) -> str:
    """The ``x.compile(...)`` statement as ``x = torch.compile(x, ...)``, its arguments kept."""
    import libcst as cst  # the fix extra, needed by --fix only

    from ...cst_tools import code_of, replace

    call = source.call_at(req.line, "compile", what="`.compile()`")
    expression = source.parent(call)
    if not isinstance(expression, cst.Expr) or not isinstance(call.func, cst.Attribute):
        raise ByHand(f"{req.where}: the `.compile()` call is not a statement of its own; compile the model by hand")
    torch_name = source.alias_of("torch")
    if torch_name is None:
        raise ByHand(f"{source.name} does not import torch; write `{req.params['target']} = torch.compile(...)`")
    target = code_of(call.func.value)
    arguments = "".join(f", {code_of(a).rstrip(', ')}" for a in call.args)
    assign = cst.parse_statement(f"{target} = {torch_name}.compile({target}{arguments})\n")
    assert isinstance(assign, cst.SimpleStatementLine)  # one small statement parsed
    return replace(source, {expression: lambda _node: assign.body[0]})


RULE = register(
    Rule("compile-nothing", detect=(Detect("runtime", compiled_nothing),), measure=measure, edit=edit, rewrite=rewrite)
)
