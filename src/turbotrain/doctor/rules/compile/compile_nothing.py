"""`compile-nothing`: the script called torch.compile and torch compiled nothing in the run, the model ran
eagerly: ``model.compile()`` on a module whose call is all torch's own code (an ``nn.Sequential`` of torch's
layers, which Dynamo skips), ``torch.compile(model)`` as a statement (its result dropped), or ``compiled =
torch.compile(model)`` with the steps calling ``model``. Timed: the model as it ran against ``torch.compile`` of it,
over the run's length where it is known.

Reads: run + model + source.
Edit: `model.compile(...)` or `torch.compile(model, ...)` as a statement becomes `model = torch.compile(model, ...)`.

``Module.compile()`` compiles the module's ``_call_impl``; torch 2.13 skips every frame of torch's own module code,
so where the module's forward and all its children's are torch's too, no frame is left to compile (0 graphs, no
error, no warning). ``torch.compile(module)`` wraps the call from outside and traces it, torch's modules included.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch

from ....measure import copy_for_trial
from ...edits import PRECISION, ByHand, EditSpec
from ...findings import Evidence, Finding, Fix
from ...requests import OwnTrial
from ..rule import Detect, Measured, Rule, TimeLeft, register
from ._common import Variant, compile_result, seconds_text, submodule_path, time_variants, user_codes
from ._compile_calls import DROPPED, IN_PLACE, UNUSED, compile_calls_that_ran, in_place_compiled
from ._common import RUN_UNIT, run_length
from .compile_pays_back import pays_after

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...sites import Site
    from ...cst_tools import Source
    from ...edits import EditRequest

# What a first compile of a small model costs here, for the budget to hold one before it is timed (nothing of the
# run compiled to say better).
GUESS_COMPILE_S = 3.0


@dataclass(frozen=True)
class NothingEvidence(Evidence):
    form: str  # IN_PLACE, DROPPED or UNUSED
    target: str  # the model as the script writes it where the fix assigns it ("model", "net.encoder")
    module: str  # the class of the module compiled (the captured model's, or the one compiled in place)
    path: str = ""  # IN_PLACE: the compiled module's name in the model ("": the model itself)
    compiled_as: str = ""  # UNUSED: the name torch.compile's result was given


def compiled_nothing(ctx: Context) -> Iterator[Finding]:
    if ctx.capture is None or user_codes(ctx):
        return
    in_place = in_place_compiled(ctx.capture.module)
    for site, form in compile_calls_that_ran(ctx):
        if form is not None and (form[0] == IN_PLACE) == bool(in_place):
            yield _finding(ctx, site, *form, in_place)
            return


def _finding(
    ctx: Context, site: Site, form: str, target: str, compiled_as: str, in_place: list[tuple[str, torch.nn.Module]]
) -> Finding:
    assert ctx.capture is not None  # the detector checked it
    path, module = in_place[0] if in_place else ("", ctx.capture.module)
    cls = type(module).__name__
    target = target or "model"
    assign = f"`{target} = torch.compile({target})`"
    if form == IN_PLACE:
        held = "self" + submodule_path(path) if path else "self.model"  # the LightningModule's attribute
        message = (
            f"`{target}.compile()` compiled nothing: a call of {cls} runs only torch's own module code (its forward "
            "and its layers'), every frame of which torch.compile skips, so torch compiled no graph in this run and "
            f"the model ran eagerly. torch.compile({target}) traces the call from outside, torch's modules included."
        )
        fix = Fix(
            f"{assign} in place of `{target}.compile()`",
            lightning=f"`{held} = torch.compile({held})` in configure_model, not .compile() on it",
            hf_trainer="TrainingArguments(torch_compile=True), not .compile() on the model",
        )
    elif form == DROPPED:
        message = (
            f"`torch.compile({target})` returns the compiled model, and the script drops it: torch compiled nothing "
            f"in this run and {target} ({cls}) ran eagerly."
        )
        fix = Fix(
            f"{assign}: keep what torch.compile returns",
            lightning="trainer.fit(torch.compile(model), ...): hand the Trainer what torch.compile returns",
            hf_trainer="TrainingArguments(torch_compile=True)",
        )
    else:
        message = (
            f"`{compiled_as} = torch.compile({target})` makes a compiled model that the steps never call: they call "
            f"{target} ({cls}, at {ctx.where(ctx.capture.site)}), its eager original, so torch compiled nothing in "
            "this run."
        )
        fix = Fix(
            f"Call {compiled_as} in the loop in place of {target} (or write {assign})",
            lightning="trainer.fit(torch.compile(model), ...): hand the Trainer what torch.compile returns",
            hf_trainer="TrainingArguments(torch_compile=True)",
        )
    f = Finding(
        "compile-nothing",
        site=site,
        category="compute",
        message=message,
        fix=fix,
        evidence=NothingEvidence(form=form, target=target, module=cls, path=path, compiled_as=compiled_as),
        # First, before the plan's trials: what compiling would buy leads the report of a script that believes it
        # compiles.
        request=OwnTrial(first=True),
    )
    f.provisional("medium")
    f.note = "Unmeasured: the what-ifs time the model compiled with torch.compile against the eager step it ran."
    return f


def measure(ctx: Context, f: Finding, budget: TimeLeft) -> Measured | None:
    """The model as it ran (its skipped compile in place) against a copy compiled with ``torch.compile``."""
    from ....measure import judge

    assert ctx.capture is not None  # the detector checked it
    ran = copy_for_trial(ctx.capture.module)
    fixed = copy_for_trial(ctx.capture.module)
    for _, module in in_place_compiled(fixed):
        module._compiled_call_impl = None  # the fix's copy is compiled from outside only
    as_ran = Variant("as it ran (eager: torch compiled nothing)", ran, compiles=False)
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
        note = (
            f"torch.compile(model) timed on the captured batch: {step} It pays after "
            f"{pays_after(compile_s, eager_s, compiled_s):,} steps.{said_run}"
        )
        fix = None
    else:
        evidence = f.evidence_as(NothingEvidence)
        call = f"{evidence.target}.compile()" if evidence.form == IN_PLACE else f"torch.compile({evidence.target})"
        note = (
            f"torch.compile(model) timed on the captured batch: {step} Compiling does not pay here: drop "
            f"`{call}`, which compiles nothing.{said_run}"
        )
        fix = Fix(f"Drop `{call}`: it compiles nothing, and compiling the model is slower here")
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
    if evidence.form == UNUSED:
        raise ByHand(
            f"call {evidence.compiled_as} where the loop calls {evidence.target}: which name the script "
            "keeps is its own choice"
        )
    target = evidence.target
    return EditSpec(
        "rule",
        f"{target} = torch.compile({target})",
        params={"form": evidence.form, "target": target},
        numerics=PRECISION,
    )


def rewrite(source: Source, req: EditRequest) -> str:
    """The ``x.compile(...)`` statement as ``x = torch.compile(x, ...)``, its arguments kept; a ``torch.compile(x,
    ...)`` statement as ``x = torch.compile(x, ...)``."""
    import libcst as cst  # the fix extra, needed by --fix only

    from ...cst_tools import code_of, replace

    call = source.call_at(req.line, "compile", what="`.compile()`")
    expression = source.parent(call)
    if not isinstance(expression, cst.Expr):
        raise ByHand(f"{req.where}: the compile call is not a statement of its own; assign what it returns by hand")
    target = req.params["target"]
    if req.params["form"] == DROPPED:
        written = f"{target} = {code_of(call)}"
    else:
        torch_name = source.alias_of("torch")
        if torch_name is None or not isinstance(call.func, cst.Attribute):
            raise ByHand(f"{source.name} does not import torch; write `{target} = torch.compile({target})`")
        arguments = "".join(f", {code_of(a).rstrip(', ')}" for a in call.args)
        written = f"{code_of(call.func.value)} = {torch_name}.compile({code_of(call.func.value)}{arguments})"
    assign = cst.parse_statement(written + "\n")
    assert isinstance(assign, cst.SimpleStatementLine)  # one small statement parsed
    return replace(source, {expression: lambda _node: assign.body[0]})


RULE = register(
    Rule("compile-nothing", detect=(Detect("runtime", compiled_nothing),), measure=measure, edit=edit, rewrite=rewrite)
)
