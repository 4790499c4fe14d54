"""`compile-pays-back`: torch.compile's compile seconds against what it saves a step: eager against a fresh compile
timed on the captured batch; says when it pays back, or that the compiled step is slower than eager and why; with
Inductor, how many of the run's graphs came from its on-disk cache (then the run's compile seconds are a rerun's),
or, for a run that compiled anew, a fresh compile timed reading them back;
`torch.compiler.save_cache_artifacts()`/`load_cache_artifacts()` for other machines.

Reads: run + model + the loop's range.

The compile seconds are torch's count for the run (first compiles and recompiles); the step is timed on the captured
batch, the compiled model's eager original against a fresh compile of it as the script compiles it, interleaved. It
answers "why is compile slower than eager": when the compiled step is slower, running eagerly is the fix it times
(and rates); when it is faster, it says after how many steps compile has paid. Where the run's length is known (the
script ended by itself, or the recorder read its stepping loop's length: a ``for`` over ``range()``, a ``while`` a
counter ends, a Hugging Face or Lightning trainer's steps, record/cadence.py),
compiling is weighed against that whole run, and the ratio judged is the whole run's, compiling included.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch

from ....measure import copy_for_trial
from ...findings import Evidence, Finding, Fix
from ...requests import OwnTrial
from ..rule import Detect, Measured, Rule, TimeLeft, register
from ._common import (
    RUN_UNIT,
    CachedCompile,
    RunLength,
    compile_calls,
    compile_result,
    PairTiming,
    cached_compile,
    called_from_compiled_code,
    inductor_cache_dir,
    Variant,
    backend_name,
    compile_seconds,
    compiled_like,
    compiled_model,
    dynamo_context,
    eager_copy,
    in_place_site,
    is_forward_of,
    model_calls_per_step,
    recompiled,
    run_length,
    seconds_text,
    time_variants,
    user_breaks,
    user_codes,
    user_recompiles,
)

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...record.compile_watch import CompiledCode
    from ...cst_tools import CommandLineOption


@dataclass(frozen=True)
class CompileCostEvidence(Evidence):
    first_compile_s: float
    recompile_s: float
    graphs: int
    breaks: int


def pays_after(compile_s: float, eager_s: float, compiled_s: float) -> int | None:
    """Steps until what a faster compiled step saves covers ``compile_s``; None when it saves nothing."""
    saved = eager_s - compiled_s
    return math.ceil(compile_s / saved) if saved > 0 else None


SLOWER_EAGER = 2.0  # untimed, a run whose compile would need eager steps this much slower to pay back rates medium


def _beside_the_run(ctx: Context, compile_s: float) -> tuple[str, float]:
    """What compiling is beside the whole run, where its length is known: its share of the run, and how slow eager
    steps would have to be, against the compiled one, for it to pay back in that many steps (("", 1.0) where the
    length is not known)."""
    length, step_s = run_length(ctx), ctx.step_s
    if length is None or step_s <= 0:
        return "", 1.0
    steps = length.steps
    training_s = steps * step_s
    needed = step_s + compile_s / steps
    said = (
        f"This run ended by itself after {steps:,} steps of {seconds_text(step_s)}: compiling was"
        if length.ended
        else f"The script's loop runs {steps:,} steps ({length.loop}) of {seconds_text(step_s)}: compiling is"
    )
    return (
        f" {said} {compile_s / (compile_s + training_s):.1%} of its {seconds_text(compile_s + training_s)}; to pay "
        f"back in {steps:,} steps, eager steps would have to take {seconds_text(needed)}, {needed / step_s:.2f}x "
        "the compiled step."
    ), needed / step_s


def pays_back(ctx: Context) -> Iterator[Finding]:
    codes = user_codes(ctx)
    if not codes:
        return
    first, again = compile_seconds(ctx)
    model, inner = compiled_model(ctx), called_from_compiled_code(ctx)
    run_said, eager_needed = _beside_the_run(ctx, first + again)
    f = Finding(
        "compile-pays-back",
        # The compiled model's call, the line that compiled it in place, or the compiled function (a model captured
        # inside it is called from there).
        site=ctx.capture.site
        if model is not None and ctx.capture is not None
        else in_place_site(ctx, inner) or codes[0].site,
        category="python_overhead",
        message=(
            f"torch.compile spent {seconds_text(first + again)} compiling {_names(codes)}"
            f" in this run ({seconds_text(first)} first compiles, {seconds_text(again)} recompiles): paid once per "
            "run and per new input. Whether the compiled step wins it back is timed against eager." + run_said
        ),
        fix=Fix("Keep torch.compile where the compiled step is faster; run eagerly where it is not"),
        evidence=CompileCostEvidence(
            first_compile_s=round(first, 3),
            recompile_s=round(again, 3),
            graphs=sum(c.graphs for c in codes),
            breaks=sum(len(user_breaks(c)) for c in codes),
        ),
        # First, before the plan's trials: whether compiling pays leads a compiled script's report, and the
        # default budget keeps room for this one compile (doctor/diagnose.py).
        request=OwnTrial(first=True) if model is not None or inner is not None else None,
    )
    f.provisional("medium" if eager_needed >= SLOWER_EAGER else "low")
    f.note = (
        "Unmeasured: the what-ifs time the compiled step against eager."
        if model is not None or inner is not None
        else f"The script compiles a function ({_names(codes)}), not a model the "
        "what-ifs can compile alike: the compiled step is not timed against eager."
    )
    yield f


SMALL_STEP_S = 0.010  # a compiled step this short on a CPU is made of small ops: call overhead can outweigh fusing


def _why_slower(ctx: Context, model_backend: str, codes: list[CompiledCode], compiled_s: float) -> str:
    """What can make this compiled step slower than eager, from what the run saw of the model's ``codes``."""
    breaks = sum(len(user_breaks(c)) for c in codes)
    reasons = []
    if model_backend in ("eager", "aot_eager"):
        reasons.append(f"backend='{model_backend}' only traces the model (no kernels are generated), adding guards")
    if breaks:
        reasons.append(f"{breaks} graph break(s) split the step into small graphs with Python between them")
    if any(user_recompiles(c) for c in codes):
        reasons.append("recompiles add guard checks on every call")
    if not ctx.on_gpu and compiled_s < SMALL_STEP_S:
        reasons.append("on a CPU with small ops, each graph's call overhead can exceed what fusing saves")
    return "; ".join(reasons) or (
        "no graph break or recompile of the model's was seen, so its compiled kernels themselves are slower than "
        "eager's here (compare the top ops of a compiled and an eager run, --trace)"
    )


def _compile_option(ctx: Context) -> CommandLineOption | None:
    """The command-line option whose ``if`` turns the script's one ``torch.compile`` call on (llm.c's ``if
    args.compile:``), where the file declares it with argparse and it is off by default; None otherwise, or without
    libcst (the fix extra) to read it."""
    calls = compile_calls(ctx)
    if len(calls) != 1:
        return None
    index, call = calls[0]
    try:
        import libcst as cst

        from ...cst_tools import Source

        source = Source(index.text, os.path.basename(index.path))
    except Exception:  # noqa: BLE001 - no libcst, or a file libcst cannot parse: the option is not named
        return None
    found = source.calls_at(call.lineno, "compile")
    child: cst.CSTNode | None = found[0] if found else None
    for node in source.ancestors(child) if child is not None else ():
        if isinstance(node, cst.If):
            option = source.command_line_option(node.test) if child is node.body else None
            return option if option is not None and option.default in ("", "0", "False", "None") else None
        child = node
    return None


_EAGER_FIX = Fix(
    "Run this model eagerly (drop torch.compile), or fix its graph breaks first and time it again",
    lightning="Drop the torch.compile of the LightningModule (or fix its graph breaks first)",
    hf_trainer="TrainingArguments(torch_compile=False)",
)


def _said(
    ctx: Context, timing: PairTiming, compile_s: float, backend: str, codes: list[CompiledCode] | None = None
) -> tuple[str, Fix]:
    """The note and the fix, from the timed eager (``b``) and compiled (``a``) steps."""
    compiled_s, eager_s = timing.a_s, timing.b_s
    steps = pays_after(compile_s, eager_s, compiled_s)
    length = run_length(ctx)
    if steps is not None and length is not None and steps > length.steps:
        compiled_run, eager_run = run_seconds(ctx, compile_s, compiled_s / eager_s, eager_s)
        took = "took" if length.ended else "takes"
        note = (
            f"Compile costs {seconds_text(compile_s)} and saves {(eager_s - compiled_s) * 1e3:.2f} ms a step "
            f"({eager_s * 1e3:.2f} ms eager, {compiled_s * 1e3:.2f} ms compiled): it pays after {steps:,} steps, "
            f"and {'this run ended after' if length.ended else 'the script runs'} {length.steps:,}. Compiled it "
            f"{took} about {seconds_text(compiled_run)}; eager it would {'have taken' if length.ended else 'take'} "
            f"about {seconds_text(eager_run)}."
        )
        option = _compile_option(ctx)
        drop = f"run the script without {option.flag}, {option.said}" if option is not None else "drop torch.compile"
        fix = Fix(
            f"Train runs of {length.steps:,} steps eagerly ({drop}); keep compiling for runs of over {steps:,}",
            lightning=f"Drop the torch.compile of the LightningModule for runs of {length.steps:,} steps",
            hf_trainer=f"TrainingArguments(torch_compile=False) for runs of {length.steps:,} steps",
        )
        return note, fix
    if steps is not None:
        runs = f", and the script runs {length.steps:,}" if length is not None and not length.ended else ""
        note = (
            f"Compile costs {seconds_text(compile_s)} and saves {(eager_s - compiled_s) * 1e3:.2f} ms a step "
            f"({eager_s * 1e3:.2f} ms eager, {compiled_s * 1e3:.2f} ms compiled): it pays after {steps:,} steps"
            f"{runs}. Running eagerly instead would be slower."
        )
        return note, Fix(f"Keep torch.compile on runs longer than {steps:,} steps; run shorter ones eagerly")
    note = (
        f"The compiled step is slower than eager: {compiled_s * 1e3:.2f} ms compiled against {eager_s * 1e3:.2f} ms "
        f"eager, after {seconds_text(compile_s)} of compiling; compile never pays back here. Why: "
        f"{_why_slower(ctx, backend, user_codes(ctx) if codes is None else codes, compiled_s)}."
    )
    return note, _EAGER_FIX


def run_seconds(ctx: Context, compile_s: float, ratio: float, eager_s: float) -> tuple[float, float]:
    """The run's seconds compiled (its compiling and its steps, as measured) and as eager steps would have made
    them: each step longer by what one model step took eager beyond compiled (``ratio``: compiled / eager)."""
    length = run_length(ctx)
    steps = length.steps if length is not None else 0
    return compile_s + steps * ctx.step_s, steps * (ctx.step_s + eager_s * (1.0 - ratio))


def priced_codes(codes: list[CompiledCode], model: torch.nn.Module | None) -> tuple[list[CompiledCode], list[str]]:
    """The compiled codes whose compiling running ``model`` eagerly saves, and the names of those it does not: a
    compiled model's own forward, where the script compiled other functions apart (nanochat's optimizer steps,
    compiled eager or not); every code where the model is not a compiled one or none of them is its forward."""
    own = [c for c in codes if is_forward_of(model, c)] if model is not None else []
    if not own:
        return codes, []
    return own, sorted({c.name for c in codes if not any(c is o for o in own)})


def measure(ctx: Context, f: Finding, budget: TimeLeft) -> Measured | None:
    """The compiled model (fresh, as the script compiles it) against its eager original, interleaved."""
    from ....measure import judge

    model, inner = compiled_model(ctx), called_from_compiled_code(ctx)
    codes = user_codes(ctx)
    priced, apart = priced_codes(codes, model if model is not None else inner)
    first, again = compile_seconds(ctx, priced)
    if model is not None:
        compiled = Variant("compiled as the script compiles it", recompiled(model))
        eager = Variant("eager (no torch.compile)", eager_copy(model), compiles=False)
        backend = backend_name(model)
    elif inner is not None and dynamo_context(inner) is not None:
        # Compiled in place (inner.compile(mode=...)): a copy compiled with the settings torch kept for it.
        compiled = Variant("compiled as the script compiles it", compiled_like(inner, copy_for_trial(inner)))
        eager = Variant("eager (no torch.compile)", copy_for_trial(inner), compiles=False)
        backend = backend_name(inner)
    elif inner is not None:
        alone: torch.nn.Module = torch.compile(copy_for_trial(inner))  # type: ignore[assignment]  # a Module in, out
        compiled = Variant("compiled with Inductor's default options", alone)
        eager = Variant("eager (no torch.compile)", copy_for_trial(inner), compiles=False)
        backend = "inductor"
    else:
        return None
    timing = time_variants(ctx, budget, compiled, eager, first)
    if timing is None:
        return None
    note, fix = _said(ctx, timing, first + again, backend, priced)
    calls = model_calls_per_step(ctx)
    if calls > 1:
        note += f" A step runs the model {calls} times (its micro-batches): the step figures are its {calls} calls."
    if apart:
        note += (
            f" Priced at the model's own compiling, {seconds_text(first + again)} of the run's "
            f"{seconds_text(sum(compile_seconds(ctx)))}: run eagerly, the script still compiles {', '.join(apart)}."
        )
    hits, misses = sum(c.cache_hits for c in codes), sum(c.cache_misses for c in codes)
    # Inductor keeps compiled graphs on disk: where the run compiled them anew, a fresh compile is timed reading them.
    cached = cached_compile(ctx, model, budget) if model is not None and backend == "inductor" and not hits else None
    alike = "" if inner is None or dynamo_context(inner) is not None else _compiled_alike(inner, codes)
    note = " ".join(
        filter(None, [note, alike, cache_note(hits, hits + misses, first + again, cached, inductor_cache_dir())])
    )
    # The ratio judged is what running eagerly buys: > 1 where compile made the step slower; for a run of known
    # length, what it buys the whole run, compiling included.
    ratios, applies_to = list(timing.ratios), ctx.share("compute") + ctx.share("python_overhead")
    length = run_length(ctx)
    if length is not None:
        ratios = [
            compiled / eager for compiled, eager in (run_seconds(ctx, first + again, r, timing.b_s) for r in ratios)
        ]
        applies_to = 1.0
    verdict = judge(ratios, noise_floor=ctx.noise_floor)
    steps = pays_after(first + again, timing.b_s, timing.a_s)
    fix = _about_even(length, steps, verdict.faster) or fix
    result = compile_result(compiled, eager, timing, first + again, steps)
    result = dataclasses.replace(result, run_steps=length.steps if length is not None else None)
    return Measured(
        what_if=dataclasses.replace(result, cached_compile_s=round(cached.seconds, 3)) if cached else result,
        verdict=verdict,
        applies_to=applies_to,
        fix=fix,
        note=note,
        unit=RUN_UNIT if length is not None else "model's step time",
    )


def _about_even(length: RunLength | None, pays_after_steps: int | None, eager_faster: bool) -> Fix | None:
    """The fix where compile pays back only after the run's end yet eager would not finish it measurably sooner
    (nanochat: pays after 44 steps, 40 in the run, x1.01): keep compiling, rather than "train it eagerly"."""
    if length is None or pays_after_steps is None or pays_after_steps <= length.steps or eager_faster:
        return None
    return Fix(
        f"Keep torch.compile: over {length.steps:,} steps eager and compiled come out about even here, and compiled "
        f"is ahead from step {pays_after_steps:,} on"
    )


def _names(codes: list[CompiledCode]) -> str:
    """The compiled codes' names, as the report says them ("forward", "training_step")."""
    return ", ".join(sorted({c.name for c in codes}))


def _compiled_alike(model: torch.nn.Module, codes: list[CompiledCode]) -> str:
    """What was timed in place of the script's compiled code: the model itself (compiled in place, its own forward
    the code), or the model a compiled function calls, compiled alone."""
    forward = getattr(type(model).forward, "__code__", None)
    if forward is not None and any(
        c.code.file == forward.co_filename and c.code.line == forward.co_firstlineno for c in codes
    ):
        return "Timed on the model compiled with Inductor's default options (the script compiles it in place)."
    return (
        f"Timed on the model {_names(codes)} calls, compiled alone with Inductor's "
        "default options (the script's graph also holds what else that function computes, the loss)."
    )


def cache_note(run_hits: int, run_graphs: int, run_s: float, cached: CachedCompile | None, folder: str) -> str:
    """What Inductor's on-disk cache (in ``folder``) changes: a run that read its graphs from it compiled as a rerun
    does (``run_s``); a run that compiled them anew left them there, which a fresh compile was measured to read."""
    carry = (
        "To carry it to other machines (CI, a cluster's nodes): torch.compiler.save_cache_artifacts() after a run, "
        "torch.compiler.load_cache_artifacts() before compiling."
    )
    if run_hits:
        return (
            f"This run read {run_hits} of {run_graphs} graph(s) from Inductor's cache ({folder}): its "
            f"{seconds_text(run_s)} of compiling is what a rerun on this machine pays. {carry}"
        )
    if cached is not None and cached.graphs_read:
        # In this process torch.compile's start-up is paid already: a new process pays it on top of this.
        return (
            f"This run compiled its graphs anew and left them in Inductor's cache ({folder}): a fresh compile of one "
            f"batch here read {cached.graphs_read} graph(s) from it in {seconds_text(cached.seconds)}, so a rerun on "
            f"this machine reads them instead of compiling them anew (a new process still pays torch.compile's "
            f"start-up, part of this run's {seconds_text(run_s)}). {carry}"
        )
    return ""


RULE = register(Rule("compile-pays-back", detect=(Detect("runtime", pays_back),), measure=measure))
