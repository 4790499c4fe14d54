"""`activation-memory`: activations saved for backward are the largest part of the step's peak (a third or more): the
blocks that save the most, with class and line; checkpointing them, bf16 autocast, two micro-batches and, where the
script zero-fills its gradients (`zero_grad(set_to_none=False)`), `set_to_none=True`, each measured for peak bytes
and step time.

Reads: model.
Edit: the named blocks' call in their parent's `forward` wrapped in `torch.utils.checkpoint.checkpoint(block, x,
use_reentrant=False)` (`self.wide(x)`, the variable of a loop over `self.blocks`, or `self.blocks[0](x)`), unless
another fix measured on copies takes the peak at least as far down and is faster: then that one, as `out-of-memory`
writes it (micro-batches or bf16 autocast in the training loop; `zero_grad(set_to_none=True)` at the zero-filling
call), its line saying the trade against checkpointing. Where checkpointing does not lower the peak 2%, the fix that
lowers it most. A fix for memory, kept when it lowers the peak whatever it costs in time, which its line states; by
hand where no fix measured lowers the peak, or a block is called from several files.

One step of the captured model is measured on copies (``Context.step_memory``); the blocks that save the most are
named with their class and line, and the fixes that trade memory for time (checkpointing those blocks, bf16
autocast, two micro-batches with accumulation, and where the script zero-fills its gradients,
``zero_grad(set_to_none=True)``) are each measured against the same baseline for the peak and the step time
(:mod:`~turbotrain.doctor.analysis.memory_fixes`). ``--fix`` writes checkpointing, unless another fix measured takes
the peak as far down, faster (:func:`ranked`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Literal, Sequence

from ....measure import judge
from ...analysis.memory import blocks_to_checkpoint, capacity_bytes
from ...analysis.memory_fixes import (
    FixCost,
    OverBudget,
    bf16_autocast,
    checkpointing,
    micro_batches,
    set_to_none,
)
from ...edits import EXACT, PRECISION, ByHand, EditSpec
from ...findings import Evidence, Finding
from ...module_stacks import blocks_text, module_text, stacked
from ...record.memory_watch import ModuleActivations
from ...requests import OwnTrial
from ...results import MeasuredFix, MemoryResult
from ..rule import Detect, Measured, Rule, TimeLeft, register
from ._loop_edits import LOOP_FIXES, loop_edit
from ._text import compiled, fix_for, measured, size_text

if TYPE_CHECKING:
    from ...analysis.context import Context

# Activations must hold at least this share of the step's peak, and more than any other part, for the finding.
ACTIVATION_SHARE = 1 / 3
# A fix must take the step's peak this far under its baseline to be written, as --verify keeps a memory fix.
SAVES = 0.98
# Steps one fix costs to measure (warm-up, the dispatch-mode step at several times a step, timed steps; both sides).
STEPS_PER_FIX = 20


@dataclass(frozen=True)
class ActivationEvidence(Evidence):
    peak_bytes: int
    activation_bytes: int
    blocks: dict[str, int]  # the blocks to checkpoint, largest saver first: bytes each saves for backward
    called_at: dict[str, str | None]  # where each block's call is, where known
    capacity_bytes: int | None
    tight: bool  # the peak is over half the device: the memory checkpointing saves is needed


def activation_memory(ctx: Context) -> Iterator[Finding]:
    memory = ctx.step_memory
    if memory is None or not memory.peak_bytes:
        return
    share = memory.peak.activations / memory.peak_bytes
    blocks = blocks_to_checkpoint(memory.modules, memory.activation_bytes)
    peak = memory.peak
    largest = max(peak.parameters + peak.buffers, peak.gradients, peak.optimizer_state, peak.temporaries, peak.inputs)
    if share < ACTIVATION_SHARE or peak.activations <= largest or not blocks:
        return
    rows = {m.name: m for m in memory.modules}
    named = _named(ctx, [rows[name] for name in blocks])
    capacity = capacity_bytes(memory)
    tight = capacity is not None and memory.peak_bytes * 2 > capacity
    headroom = f"; {size_text(capacity - memory.peak_bytes)} of the device left" if capacity else ""
    f = Finding(
        "activation-memory",
        site=rows[blocks[0]].site,
        message=(
            f"Activations saved for backward are {share:.0%} of the step's peak ({size_text(memory.peak.activations)} "
            f"of {size_text(memory.peak_bytes)}, at the {memory.peak_phase}{headroom}). The blocks that save the "
            f"most: {named}."
        ),
        fix=fix_for("checkpointing", blocks_text(blocks)),
        evidence=ActivationEvidence(
            peak_bytes=memory.peak_bytes,
            activation_bytes=memory.peak.activations,
            blocks={name: rows[name].total_bytes for name in blocks},
            called_at={name: ctx.where(rows[name].call) for name in blocks if rows[name].call is not None},
            capacity_bytes=capacity,
            tight=tight,
        ),
        request=OwnTrial(),
    )
    f.provisional("medium" if tight else "low")
    f.note = "Memory for time: worth it where the step does not fit, or to fit a larger batch."
    if capacity is not None and not tight:
        f.fold = "fits"  # a line under the findings, not a finding read as a slowdown to act on
    yield f


def _named(ctx: Context, blocks: Sequence[ModuleActivations]) -> str:
    """Each block with its class, line and bytes; one list's blocks of one class (a stack) said once."""
    return "; ".join(
        module_text(
            s.name, s.class_name, s.count, ctx.where(s.first.site) if s.first.site else None, size_text(s.total_bytes)
        )
        for s in stacked(blocks)
    )


def measure(ctx: Context, finding: Finding, budget: TimeLeft) -> Measured | None:
    """Checkpointing the named blocks, bf16 autocast and two micro-batches, each against its own baseline."""
    capture, memory = ctx.capture, ctx.step_memory
    if capture is None or memory is None:
        return None
    optimizers = [opt for opt, _ in ctx.optimizers]
    batch = (capture.args, capture.kwargs)
    blocks = list(finding.evidence_as(ActivationEvidence).blocks)
    model, allows, loss = capture.module, budget.allows, ctx.script_loss
    trials: list[tuple[str, Callable[[], FixCost]]] = [
        ("checkpointing", lambda: checkpointing(model, optimizers, batch, blocks, loss, 2, allows)),
    ]
    if not ctx.facts.autocast:  # a script under autocast has what this fix would add
        trials.append(("bf16-autocast", lambda: bf16_autocast(model, optimizers, batch, loss, 2, allows)))
    if capture.batch_size % 2 == 0:
        rows, dim = capture.batch_size, capture.batch_dim
        trials.append(("micro-batches", lambda: micro_batches(model, optimizers, batch, 2, rows, dim, loss, 2, allows)))
    if ctx.ran_sites("zero_grad_zeros"):  # zero-filled gradients, kept through the next forward
        trials.append(("set-to-none", lambda: set_to_none(model, optimizers, batch, loss, 2, allows)))
    costs: list[FixCost] = []
    over: list[str] = []
    for i, (_, trial) in enumerate(trials):
        if not budget.allows(STEPS_PER_FIX * max(ctx.step_s, 1e-3)):
            left = ", ".join(name for name, _ in trials[i:])
            over.append(f"{left}: the what-if budget left could not hold {STEPS_PER_FIX} of the script's steps")
            break
        try:
            costs.append(trial())
        except OverBudget as why:
            over.append(str(why))
    unmeasured = f" Not measured: {'; '.join(over)}." if over else ""
    if not costs:
        finding.note = f"{finding.note or ''}{unmeasured}".strip()
        return None
    fixes = tuple(measured(c) for c in costs)
    # The fix --fix writes is the one judged, and said in each framework where it is not the recomputation.
    order = ranked(fixes)
    pick = order[0] if order else fixes[0]
    ratio = pick.baseline_ms / pick.fixed_ms if pick.fixed_ms else 0.0
    said = "; ".join(
        f"{c.fix} {c.detail}: {size_text(c.baseline.peak_bytes)} -> {size_text(c.fixed.peak_bytes)}, "
        f"{c.baseline.step_seconds * 1e3:.1f} -> {c.fixed.step_seconds * 1e3:.1f} ms"
        for c in costs
    )
    return Measured(
        what_if=MemoryResult(rows=capture.batch_size, fixes=fixes),
        verdict=judge([ratio]),
        applies_to=ctx.share("compute") + ctx.share("optimizer") + ctx.share("python_overhead"),
        fix=fix_for(pick.fix, pick.detail) if pick.fix != "checkpointing" else None,
        note=f"Measured, peak and step{' (each side run eagerly, not compiled again per fix)' if compiled(ctx) else ''}"
        f": {said}.{unmeasured}",
    )


def _ratio(row: MeasuredFix, what: Literal["bytes", "ms"]) -> float:
    """A measured fix's bytes or ms over its own baseline's (each fix has its baseline, measured beside it)."""
    base, fixed = (row.baseline_bytes, row.fixed_bytes) if what == "bytes" else (row.baseline_ms, row.fixed_ms)
    return fixed / base if base else 1.0


def ranked(rows: Sequence[MeasuredFix]) -> list[MeasuredFix]:
    """The measured fixes that lower the peak by :data:`SAVES` (as ``--verify`` keeps a memory fix), in the order
    ``--fix`` tries them: those that take the peak as far down as checkpointing the named blocks and are faster
    (fastest first), then the checkpointing; where checkpointing does not lower the peak, the fix that lowers it most
    first."""
    saving = [r for r in rows if _ratio(r, "bytes") < SAVES]
    recompute = next((r for r in saving if r.fix == "checkpointing"), None)
    if recompute is None:
        return sorted(saving, key=lambda r: (_ratio(r, "bytes"), _ratio(r, "ms")))
    bytes_, ms = _ratio(recompute, "bytes"), _ratio(recompute, "ms")
    better = [r for r in saving if _ratio(r, "bytes") <= bytes_ and _ratio(r, "ms") < ms]
    return [*sorted(better, key=lambda r: _ratio(r, "ms")), recompute]


def edit(ctx: Context, f: Finding) -> EditSpec:
    """:func:`_chain`, each edit saying whether the step needs the memory (see ``EditSpec.needed``)."""
    needed = f.evidence_as(ActivationEvidence).tight
    specs = [_chain(ctx, f)]
    while (instead := specs[-1].instead) is not None:
        specs.append(instead)
    chain = None
    for spec in reversed(specs):
        chain = dataclasses.replace(spec, needed=needed, instead=chain)
    assert chain is not None
    return chain


def _chain(ctx: Context, f: Finding) -> EditSpec:
    """The first fix of :func:`ranked` the source takes, the next ones each its ``instead``. Checkpointing: each
    named block's call, in its parent's forward, wrapped in ``torch.utils.checkpoint.checkpoint`` (recomputed in the
    backward; checkpoint restores the random state, so dropout draws the same). Micro-batches or bf16 autocast:
    written into the training loop (:mod:`._loop_edits`); ``zero_grad(set_to_none=True)`` at the zero-filling call.
    For memory, at a cost in time. Checkpointing where nothing was measured; by hand where nothing measured lowers
    the peak."""
    rows = f.what_if.fixes if isinstance(f.what_if, MemoryResult) else ()
    order = ranked(rows)
    if rows and not order:
        said = "; ".join(f"{r.fix} {size_text(r.baseline_bytes)} -> {size_text(r.fixed_bytes)}" for r in rows)
        raise ByHand(
            f"none of the fixes measured on copies lowers the step's peak ({said}): the peak holds what the backward "
            "needs again; a smaller batch does"
        )
    if not order:
        return _checkpoint(ctx, f)
    recompute = next((r for r in rows if r.fix == "checkpointing"), None)
    specs: list[EditSpec] = []
    reasons: list[str] = []
    for row in order:
        try:
            specs.append(_spec(ctx, f, row, recompute))
        except ByHand as exc:
            reasons.append(str(exc))
    if not specs:
        raise ByHand("; ".join(reasons))
    chain = specs[-1]
    for spec in reversed(specs[:-1]):
        chain = dataclasses.replace(spec, instead=chain)
    return chain


def _spec(ctx: Context, f: Finding, row: MeasuredFix, recompute: MeasuredFix | None) -> EditSpec:
    """``row``'s fix as an edit, its label ending in the trade it was measured to make against checkpointing."""
    if row.fix == "checkpointing":
        return _checkpoint(ctx, f)
    down, time = 1 - _ratio(row, "bytes"), _ratio(row, "ms")
    why = (
        f" (measured to take the peak {down:.0%} down against checkpointing's {1 - _ratio(recompute, 'bytes'):.0%}, "
        f"at x{time:.2f} the step time against its x{_ratio(recompute, 'ms'):.2f})"
        if recompute is not None
        else f" (measured to take the peak {down:.0%} down, at x{time:.2f} the step time)"
    )
    if row.fix in LOOP_FIXES:
        return loop_edit(ctx, row.fix, row.detail, why=why)
    return _set_to_none(ctx, why)


def _set_to_none(ctx: Context, why: str) -> EditSpec:
    sites = ctx.ran_sites("zero_grad_zeros")
    if len(sites) != 1:
        raise ByHand(f"zero_grad(set_to_none=True) lowers the peak{why}; write it at each zero_grad call by hand")
    site = sites[0].site
    label = f"optimizer.zero_grad(set_to_none=True): gradients freed until the next backward{why}"
    return EditSpec("zero_grad", label, numerics=EXACT, file=site.file, line=site.line, purpose="memory")


def _checkpoint(ctx: Context, f: Finding) -> EditSpec:
    memory = ctx.step_memory
    rows = {m.name: m for m in memory.modules} if memory is not None else {}
    blocks = list(f.evidence_as(ActivationEvidence).blocks)
    calls = [rows[name].call for name in blocks if name in rows]
    sites = [c for c in calls if c is not None]
    if not blocks or len(sites) < len(blocks) or len({c.file for c in sites}) != 1:
        raise ByHand(
            f"{', '.join(blocks) or 'the blocks'}: not each called from one line of one of your files; wrap each "
            "call in torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) by hand"
        )
    lines = sorted({c.line for c in sites})
    return EditSpec(
        "checkpoint",
        f"recompute {blocks_text(blocks)} in the backward (torch.utils.checkpoint)",
        {"blocks": blocks},
        # The same arithmetic, but on the CPU not bitwise: the losses differed by 1e-7 once recomputed.
        numerics=PRECISION,
        file=sites[0].file,
        line=lines[0],
        lines=tuple(lines[1:]),
        purpose="memory",
    )


RULE = register(Rule("activation-memory", detect=(Detect("live", activation_memory),), measure=measure, edit=edit))
