"""`compile-mode`: a model compiled with `mode='max-autotune'`: the script's mode against the default mode timed, fresh
compiles of both, their first-call seconds and the step, and for how many steps the tuned kernels pay for their
compile; `mode='reduce-overhead'` on a run without CUDA (its CUDA graphs change nothing there), said.

Reads: run + model.
Edit: `mode='default'` at the model's `.compile(...)` call or the script's one `torch.compile(...)` call (by hand
where it has several).

The model is the one `torch.compile(model)` returned, or a module compiled in place (`model.compile(...)`).

A model compiled with ``mode="max-autotune"`` (or ``max-autotune-no-cudagraphs``) spends its compile benchmarking
kernels: timed, the model compiled in the script's mode against the default mode, fresh compiles of both, their
first calls and the step, interleaved; the verdict is the step's, and the note says for how many steps the tuned
kernels pay for their compile. On a run without CUDA, ``mode="reduce-overhead"`` (CUDA graphs) changes nothing:
said, not timed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Iterator, Literal

import torch

from ...edits import EditSpec
from ...findings import Evidence, Finding, Fix
from ...requests import OwnTrial
from ..rule import Detect, Measured, Rule, TimeLeft, register
from ._common import (
    PairTiming,
    Variant,
    compile_site,
    compile_edit,
    compile_edit_at,
    compiled_in_place,
    dynamo_context,
    in_place_site,
    compile_seconds,
    compiled_model,
    eager_copy,
    recompiled,
    script_backend_config,
    script_dynamic,
    seconds_text,
    measured_pair,
    one_compile_call,
    trade_off,
    user_codes,
)

if TYPE_CHECKING:
    from ...analysis.context import Context

AUTOTUNE: Final = "max-autotune"
CUDA_GRAPHS: Final = "cuda-graphs-without-cuda"


@dataclass(frozen=True)
class ModeEvidence(Evidence):
    mode: Literal["max-autotune", "cuda-graphs-without-cuda"]
    first_compile_s: float | None = None  # max-autotune's


def _script_model(ctx: Context) -> torch.nn.Module | None:
    """The captured model as the script compiled it: an OptimizedModule, or a module compiled in place."""
    model = compiled_model(ctx)
    return model if model is not None else compiled_in_place(ctx)


def compile_mode(ctx: Context) -> Iterator[Finding]:
    model = _script_model(ctx)
    if model is None or not user_codes(ctx):
        return
    config = script_backend_config(model)
    site = in_place_site(ctx, compiled_in_place(ctx)) or compile_site(ctx)
    if config.get("max_autotune"):
        first, _ = compile_seconds(ctx)
        f = Finding(
            "compile-mode",
            site=site,
            category="python_overhead",
            message=(
                f"torch.compile runs in mode='max-autotune': it benchmarks kernels while compiling "
                f"({seconds_text(first)} of first compiles in this run). Whether the tuned kernels win that back "
                "is timed against the default mode."
            ),
            fix=Fix(
                "torch.compile(model) in the default mode for short runs and restarts; keep max-autotune for long "
                "runs where its faster step pays for its compile",
                lightning="Compile the LightningModule without mode='max-autotune' (torch.compile(model))",
                hf_trainer="TrainingArguments(torch_compile_mode='default')",
            ),
            evidence=ModeEvidence(AUTOTUNE, first_compile_s=round(first, 3)),
            request=OwnTrial(),
        )
        f.provisional("low")
        f.note = "Unmeasured: the what-ifs compile in both modes and time the step."
        yield f
    elif config.get("triton.cudagraphs") and not ctx.on_gpu:
        f = Finding(
            "compile-mode",
            site=site,
            category="python_overhead",
            message=(
                "torch.compile runs in mode='reduce-overhead', whose CUDA graphs need a CUDA device: on this run's "
                "CPU it compiles as the default mode does."
            ),
            fix=Fix("torch.compile(model) on the CPU; keep mode='reduce-overhead' for GPU runs bound by the host"),
            evidence=ModeEvidence(CUDA_GRAPHS),
        )
        f.provisional("low")
        yield f


def default_mode(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the script's compiled model's eager original compiled by Inductor in the default mode, with the
    script's ``dynamic`` and ``fullgraph``."""
    # torch.compile is typed for functions; given a Module it returns an OptimizedModule, a Module.
    return torch.compile(  # type: ignore[return-value]  # a Module in, a Module out
        eager_copy(model),
        dynamic=script_dynamic(model),
        fullgraph=bool(getattr(dynamo_context(model), "fullgraph", False)),
    )


def measure(ctx: Context, f: Finding, budget: TimeLeft) -> Measured | None:
    """The model compiled in the script's mode against the default mode, fresh compiles of both, interleaved."""
    model = _script_model(ctx)
    if model is None:
        return None
    tuned = Variant("compiled in the script's mode (max-autotune)", recompiled(model))
    default = Variant("compiled in the default mode", default_mode(model))

    def say(timing: PairTiming, steps_differ: bool) -> str:
        return mode_note(timing.warm_s, timing.a_s, timing.b_s, steps_differ)

    return measured_pair(ctx, budget, tuned, default, say, compile_seconds(ctx)[0])


def mode_note(first_calls_s: tuple[float, float], tuned_s: float, default_s: float, step_differs: bool) -> str:
    """What the default mode buys against max-autotune, from each side's first calls (its compile) and step;
    ``step_differs``: the rounds called the steps apart, beyond the noise."""
    tuned_compile, default_compile = first_calls_s
    said = (
        f"First calls (compiling) {seconds_text(tuned_compile)} in max-autotune against "
        f"{seconds_text(default_compile)} in the default mode; the step {tuned_s * 1e3:.2f} ms against "
        f"{default_s * 1e3:.2f} ms. "
    )
    saved = tuned_compile - default_compile
    if not step_differs:
        return (
            said
            + "The steps are alike within the noise: "
            + (
                f"the default mode saves {seconds_text(saved)} of compiling a run."
                if saved > 0
                else "max-autotune compiled no slower here, and bought nothing."
            )
        )
    return said + trade_off(saved, tuned_s - default_s, "compile in the default mode")


def edit(ctx: Context, f: Finding) -> EditSpec:
    """``mode="default"`` at the model's ``.compile(...)`` call, or the script's one ``torch.compile(...)`` call."""
    fix = "torch.compile(..., mode='default')"
    in_place = in_place_site(ctx, compiled_in_place(ctx))
    if in_place is not None:
        return compile_edit_at(in_place.file, in_place.line, fix, {"mode": "default"})
    return compile_edit(*one_compile_call(ctx, fix, "the model"), fix, {"mode": "default"})


RULE = register(Rule("compile-mode", detect=(Detect("runtime", compile_mode),), measure=measure, edit=edit))
