"""`out-of-memory`: the script died of an out-of-memory error (CUDA's or the CPU allocator's): the step, phase and
line; the step measured again at a halving of the batch that fits, what the whole batch needs (estimated), and which
fix fits (micro-batches, bf16 autocast, checkpointing), each measured.

Reads: run + model.
Edit: the fix measured to fit fastest, in the training loop at its forward: micro-batches (`for x_micro, y_micro in
zip(x.chunk(k), y.chunk(k)):` around the forward through the backward, `(loss / k).backward()`, a `zero_grad`
between them moved before the loop; the batch's names are those made in the loop and passed to the forward or the
loss) or bf16 autocast around the forward and the loss; by hand where checkpointing fits fastest, or the step is not
one forward, a loss and `loss.backward()` in the loop's own block. Where the script compiled its model: the first
fix that ran compiled at the script's batch under the limit, by hand where none did. `--verify` runs the original
once: where it runs out of memory again, only the patched script is run, every round, and the fix is kept when it
runs (`verified: the original ran out of memory, the patched script ran (... ms a step, peak ...)`).

The step is measured again at the largest halving of the captured batch that fits and is cheap to measure; what the
whole batch needs is scaled from it (estimated), and the fixes (micro-batches with accumulation, bf16 autocast,
checkpointing the blocks that save the most) are each measured there for bytes and time
(:mod:`~turbotrain.doctor.analysis.memory`). Those copies run eagerly; for a compiled model the fixes said to fit are
then run compiled at the script's batch (:mod:`._compiled_fit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Literal

from ...edits import ByHand, EditSpec
from ...findings import Evidence, Finding, Fix
from ...record.measurements import MemoryPhase
from ...results import MeasuredFix
from ..rule import Detect, Rule, register
from ._compiled_fit import CompiledCheck, compiled_check
from ._loop_edits import LOOP_FIXES, loop_edit, micro_batch_count
from ._text import compiled, fix_for, measured, size_text

if TYPE_CHECKING:
    from ...analysis.context import Context
    from ...analysis.memory import FixEstimate, FitMeasure


@dataclass(frozen=True)
class FittingFix:
    """A fix measured at the batch that fits, the bytes it would need at the script's batch, and whether they fit."""

    measured: MeasuredFix
    estimated_bytes_at_batch: int
    fits: bool

    def to_dict(self) -> dict[str, Any]:
        return {**self.measured.to_dict(), "estimated_bytes_at_batch": self.estimated_bytes_at_batch, "fits": self.fits}


@dataclass(frozen=True)
class AtFit(Evidence):
    """The step measured again at ``rows`` of the script's ``full_rows``, and the fixes measured there."""

    rows: int
    full_rows: int
    peak_bytes: int
    estimated_bytes: int
    capacity_bytes: int | None
    fixes: tuple[FittingFix, ...]


@dataclass(frozen=True)
class OutOfMemoryEvidence(Evidence):
    device: str  # "cuda", "cpu", "mps", "xpu" or "" (record/out_of_memory.py)
    phase: MemoryPhase | Literal[""]  # "": none (loading data, the script's own code)
    step: int | None
    error: str
    fit: AtFit | None = None  # measured again after the error
    compiled: CompiledCheck | None = None  # the fixes said to fit, run compiled (a compiled model only)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        fit = out.pop("fit", {})  # its fields beside the error's, as the JSON has always had them
        return {**out, **fit}


def _at_fit(fit: FitMeasure) -> AtFit:
    return AtFit(
        rows=fit.rows,
        full_rows=fit.full_rows,
        peak_bytes=fit.memory.peak_bytes,
        estimated_bytes=fit.estimated_bytes,
        capacity_bytes=fit.capacity_bytes,
        fixes=tuple(FittingFix(measured(e.cost), e.estimated_bytes, e.fits) for e in fit.fixes),
    )


def _held(fit: FitMeasure) -> str:
    peak = fit.memory.peak
    parts = (
        ("parameters", peak.parameters + peak.buffers),
        ("gradients", peak.gradients),
        ("optimizer state", peak.optimizer_state),
        ("activations", peak.activations),
        ("temporaries", peak.temporaries + peak.inputs),
    )
    return ", ".join(f"{name} {size_text(b)}" for name, b in parts if b)


def _said(fix: str, detail: str, full_rows: int) -> str:
    """The fix at the script's batch: ``32 micro-batches of 8192 rows``, ``checkpointing expand``."""
    if fix == "micro-batches":
        k = micro_batch_count(detail)
        return f"{k} micro-batches of {full_rows // k} rows"
    return f"{fix} {detail}"


def _compiled_text(check: CompiledCheck, full_rows: int) -> str:
    """What the fixes did run compiled: `` Run compiled at its 1024 rows: ...; ... ran (peak 1.0 GiB, 420 ms a
    step).``"""
    said = []
    for run in check.runs:
        fix = _said(run.fix, run.detail, full_rows)
        if run.ran:
            said.append(f"{fix} ran (peak {size_text(run.peak_bytes)}, {(run.step_seconds or 0) * 1e3:.0f} ms a step)")
        else:
            asked = f", asking for {size_text(run.requested_bytes)}" if run.requested_bytes else ""
            said.append(f"{fix} ran out of memory{asked}")
    text = f" Run compiled at its {full_rows} rows: {'; '.join(said)}." if said else ""
    if check.runs and check.first_ran is None:
        text += " None of the fixes run compiled fits: a smaller batch, or these fixes together, by hand."
    return text


def _fitting(fit: FitMeasure) -> list[FixEstimate]:
    """The fixes measured to fit at the script's batch, fastest first."""
    return sorted((e for e in fit.fixes if e.fits), key=lambda e: e.cost.fixed.step_seconds)


def out_of_memory(ctx: Context) -> Iterator[Finding]:
    recording = ctx.recording
    oom = recording.out_of_memory if recording is not None else None
    if recording is None or oom is None:
        return
    where = f" in the {oom.phase}" if oom.phase else ""
    step = f" at step {oom.step + 1}" if oom.step is not None else ""
    set_up = ctx.capture is None and not oom.phase and not recording.steps
    if set_up:  # airbench94's whitening, before any training forward ran: "at step 1" read as its first step
        step = " before its first training forward (in the script's own set-up)"
    asked = f", asking for {size_text(oom.requested_bytes)}" if oom.requested_bytes else ""
    message = f"The script ran out of {oom.device or 'device'} memory{step}{where}{asked}."
    fix = (
        Fix("do that set-up work in pieces (a part of the data at a time), or on fewer samples")
        if set_up
        else Fix(
            "make the step smaller: fewer rows per forward with gradient accumulation, bf16 autocast, or activation "
            "checkpointing of the largest blocks",
            lightning="Trainer(accumulate_grad_batches=k) with a smaller batch, precision='bf16-mixed'",
            hf_trainer="TrainingArguments(gradient_accumulation_steps=k, bf16=True, gradient_checkpointing=True)",
        )
    )
    fit = ctx.fit_after_oom
    check: CompiledCheck | None = None
    if fit is not None:
        fits = _fitting(fit)
        capacity = f" of {size_text(fit.capacity_bytes)} available" if fit.capacity_bytes else ""
        message += (
            f" Measured at {fit.rows} of its {fit.full_rows} rows the step holds {size_text(fit.memory.peak_bytes)} "
            f"({_held(fit)}); the whole batch needs about {size_text(fit.estimated_bytes)}{capacity}. "
        )
        message += (
            "Fits: "
            + "; ".join(
                f"{_said(e.cost.fix, e.cost.detail, fit.full_rows)} (~{size_text(e.estimated_bytes)})" for e in fits
            )
            + "."
            if fits
            else "None of the fixes measured fits alone: a smaller batch does."
        )
        if fits and compiled(ctx):
            check = compiled_check(ctx, fit, [e.cost for e in fits])
            message += _compiled_text(check, fit.full_rows)
        ran = check.first_ran if check is not None else None
        if ran is not None:
            fix = fix_for(ran.fix, ran.detail)
        elif fits and (check is None or not check.runs):
            fix = fix_for(fits[0].cost.fix, fits[0].cost.detail)
    elif not ctx.memory_allowed:
        message += " The step was not measured again (--no-what-if): run without it to see what fits."
    evidence = OutOfMemoryEvidence(
        device=oom.device,
        phase=oom.phase,
        step=oom.step,
        error=oom.message,
        fit=_at_fit(fit) if fit is not None else None,
        compiled=check,
    )
    f = Finding("out-of-memory", site=oom.site, message=message, fix=fix, evidence=evidence)
    f.provisional("high")
    if fit is not None:
        f.note = (
            "Bytes at the measured batch are measured; at the script's batch they are estimated (the batch-sized "
            "part scaled linearly)."
        )
        if check is not None and check.runs:
            f.note += (
                " The copies ran eagerly; the fixes said to fit were then run compiled as the script compiles its "
                "model, on its batch: two steps to compile, then one measured under the limit (on the CPU its peak is "
                "the process's resident peak over that step)."
            )
        elif compiled(ctx):
            # modded-nanogpt: "4 x 256 fits (~939.4 MiB)" of 1.1 GiB, measured eagerly; its twin died in its
            # compiled backward asking for the same 294.8 MiB as the original.
            skipped = f" (not run compiled here: {check.skipped})" if check is not None and check.skipped else ""
            f.note += (
                " The copies ran eagerly: torch.compile's graphs lay out their buffers otherwise, so check a fix said "
                f"to fit on the compiled script{skipped} (--fix with --verify runs it under the same --memory-limit)."
            )
    yield f


def edit(ctx: Context, f: Finding) -> EditSpec:
    """The fastest fix measured to fit, where it is an edit of the training loop at its forward's line (micro-batches
    or bf16 autocast: :mod:`._loop_edits`). For memory: the step fits, at a cost in time the finding states."""
    if ctx.capture is None:
        raise ByHand("the script ran out of memory before a training forward was captured: make that work smaller")
    fit = ctx.fit_after_oom
    fits = _fitting(fit) if fit is not None else []
    if fit is None or not fits:
        raise ByHand("no fix was measured to fit alone (or none was measured: --no-what-if); make the batch smaller")
    check = f.evidence_as(OutOfMemoryEvidence).compiled
    if check is not None and check.runs:
        ran = check.first_ran
        if ran is None:
            raise ByHand("none of the fixes said to fit ran compiled at the script's batch: make the batch smaller")
        return loop_edit(ctx, ran.fix, ran.detail, fit.full_rows)
    best = fits[0].cost
    if best.fix in LOOP_FIXES:
        return loop_edit(ctx, best.fix, best.detail, fit.full_rows)
    said = _said(best.fix, best.detail, fit.full_rows)
    raise ByHand(f"{said} fits fastest: the activation-memory finding's edit makes it, by hand")


RULE = register(Rule("out-of-memory", detect=(Detect("runtime", out_of_memory),), edit=edit))
