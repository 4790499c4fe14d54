"""The report's memory section: the step's peak split into what holds it, the device's total and headroom; after
an out-of-memory error, the step at a batch that fits and the fixes measured there. Typed rows for the JSON
(each ``to_dict()``), and its lines for the terminal."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ..analysis.memory import FitMeasure, capacity_bytes, size_text
from ..module_stacks import module_text, stacked
from ..record.measurements import MemoryPhase
from ..record.memory_watch import PeakSplit, StepMemory

if TYPE_CHECKING:
    from ..analysis.context import Context

__all__ = [
    "memory_section",
    "memory_lines",
    "MemorySection",
    "MemoryMeasured",
    "MemoryNotMeasured",
    "MemoryModuleRow",
    "MemoryFixRow",
    "MemoryAtFit",
]

TOP_MODULES = 5  # module rows in the section


@dataclass(frozen=True)
class MemoryModuleRow:
    """A module whose forward saved the most for backward, or the same module of each block of a stack
    (``transformer.h.0-11``, 12 blocks; JSON ``top_modules``; ``class_name`` is ``class``); named ``""``, what the
    model's own forward saved outside its submodules."""

    name: str
    class_name: str
    bytes: int
    where: str | None
    blocks: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "class": self.class_name,
            "bytes": self.bytes,
            "where": self.where,
            "blocks": self.blocks,
        }


@dataclass(frozen=True)
class MemoryFixRow:
    """A fix measured at the batch that fits, and what it would need at the script's batch (JSON ``fixes``)."""

    fix: str
    detail: str
    fixed_bytes: int
    baseline_ms: float
    fixed_ms: float
    estimated_bytes_at_full_batch: int
    fits: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MemoryAtFit:
    """After an out-of-memory error: the script's batch, what it would need, the capacity and the fixes measured
    at the batch that fits (``rows``)."""

    full_rows: int
    estimated_bytes_at_full_batch: int
    capacity_bytes: int | None
    fixes: tuple[MemoryFixRow, ...]
    fixes_out_of_memory: tuple[str, ...] = ()  # fixes whose step ran out of memory at ``rows`` (--memory-limit)

    def to_dict(self) -> dict[str, Any]:
        return {
            "full_rows": self.full_rows,
            "estimated_bytes_at_full_batch": self.estimated_bytes_at_full_batch,
            "capacity_bytes": self.capacity_bytes,
            "fixes": [f.to_dict() for f in self.fixes],
            "fixes_out_of_memory": list(self.fixes_out_of_memory),
        }


@dataclass(frozen=True)
class MemoryMeasured:
    """One step's memory, measured on copies: its peak, what held it (``parts``), the device's total and headroom;
    ``fit`` after an out-of-memory error (then ``rows`` is the batch that fit)."""

    measured: ClassVar[Literal[True]] = True
    device: str
    rows: int | None
    peak_bytes: int
    peak_phase: MemoryPhase
    parts: PeakSplit
    saved_for_backward_bytes: int
    # None: not known (the CPU's allocator does not say what it keeps beyond live tensors).
    allocator_beyond_live_bytes: int | None
    allocator_peak_bytes: int | None
    device_total_bytes: int | None
    device_free_bytes: int | None
    headroom_bytes: int | None
    top_modules: tuple[MemoryModuleRow, ...]
    fit: MemoryAtFit | None = None
    memory_limit_bytes: int | None = None  # --memory-limit: the device's size the run was told to pretend

    def to_dict(self) -> dict[str, Any]:
        parts = self.parts
        out: dict[str, Any] = {
            "measured": True,
            "device": self.device,
            "rows": self.rows,
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "parts": {
                "parameters": parts.parameters,
                "buffers": parts.buffers,
                "gradients": parts.gradients,
                "optimizer_state": parts.optimizer_state,
                "inputs": parts.inputs,
                "activations": parts.activations,
                "temporaries": parts.temporaries,
            },
            "saved_for_backward_bytes": self.saved_for_backward_bytes,
            "allocator_beyond_live_bytes": self.allocator_beyond_live_bytes,
            "allocator_peak_bytes": self.allocator_peak_bytes,
            "device_total_bytes": self.device_total_bytes,
            "device_free_bytes": self.device_free_bytes,
            "headroom_bytes": self.headroom_bytes,
            "top_modules": [m.to_dict() for m in self.top_modules],
            "memory_limit_bytes": self.memory_limit_bytes,
        }
        if self.fit is not None:
            out.update(self.fit.to_dict())
        return out


@dataclass(frozen=True)
class MemoryNotMeasured:
    """Why the step's memory was not measured."""

    measured: ClassVar[Literal[False]] = False
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"measured": False, "reason": self.reason}


# The report's memory section (JSON "memory"): measured, or why not.
MemorySection = MemoryMeasured | MemoryNotMeasured


def _step(ctx: Context, memory: StepMemory, rows: int | None, fit: MemoryAtFit | None = None) -> MemoryMeasured:
    peak, capacity = memory.peak, capacity_bytes(memory)
    return MemoryMeasured(
        device=memory.device,
        rows=rows,
        peak_bytes=memory.peak_bytes,
        peak_phase=memory.peak_phase,
        parts=peak,
        saved_for_backward_bytes=memory.activation_bytes,
        allocator_beyond_live_bytes=memory.allocator_held_bytes,
        allocator_peak_bytes=memory.allocator_peak_bytes,
        device_total_bytes=memory.memory.total_bytes,
        device_free_bytes=memory.memory.free_bytes,
        headroom_bytes=capacity - memory.peak_bytes if capacity is not None else None,
        top_modules=_top_modules(ctx, memory),
        fit=fit,
        memory_limit_bytes=memory.memory.limit_bytes,
    )


def _top_modules(ctx: Context, memory: StepMemory) -> tuple[MemoryModuleRow, ...]:
    """The modules that saved the most, a stack's blocks as one row; the root's total holds them all, so its row is
    what its own forward's lines saved (a loss computed in the model's forward: nanoGPT's cross-entropy over the
    vocabulary), named ``""``."""
    rows = [
        MemoryModuleRow(m.name, m.class_name, m.total_bytes, ctx.where(m.first.site), m.count)
        for m in stacked([m for m in memory.modules if m.name])
    ]
    rows += [
        MemoryModuleRow("", m.class_name, m.self_bytes, ctx.where(m.site))
        for m in memory.modules
        if not m.name and m.self_bytes
    ]
    return tuple(sorted(rows, key=lambda row: -row.bytes)[:TOP_MODULES])


def _module_text(row: MemoryModuleRow) -> str:
    if not row.name:
        return f"{row.class_name}.forward itself{f' ({row.where})' if row.where else ''} {size_text(row.bytes)}"
    return module_text(row.name, row.class_name, row.blocks, row.where, size_text(row.bytes))


def _fit(ctx: Context, fit: FitMeasure) -> MemoryMeasured:
    at_fit = MemoryAtFit(
        full_rows=fit.full_rows,
        estimated_bytes_at_full_batch=fit.estimated_bytes,
        capacity_bytes=fit.capacity_bytes,
        fixes=tuple(
            MemoryFixRow(
                fix=e.cost.fix,
                detail=e.cost.detail,
                fixed_bytes=e.cost.fixed.peak_bytes,
                baseline_ms=round(e.cost.baseline.step_seconds * 1e3, 3),
                fixed_ms=round(e.cost.fixed.step_seconds * 1e3, 3),
                estimated_bytes_at_full_batch=e.estimated_bytes,
                fits=e.fits,
            )
            for e in fit.fixes
        ),
        fixes_out_of_memory=fit.refused,
    )
    return _step(ctx, fit.memory, fit.rows, at_fit)


def memory_section(ctx: Context) -> MemorySection:
    """The section for ``ctx``'s run: measured (:class:`MemoryMeasured`), or why not."""
    if not ctx.memory_allowed:
        return MemoryNotMeasured("not measured (--no-what-if)")
    recording = ctx.recording
    if recording is not None and recording.out_of_memory is not None:
        if ctx.capture is None:
            return MemoryNotMeasured("the error came before a training forward was captured: nothing to measure")
        fit = ctx.fit_after_oom
        if fit is None and ctx.memory_failed is not None:
            return MemoryNotMeasured(f"one step of copies of the captured model failed: {ctx.memory_failed}")
        if fit is None and ctx.capture.batch_size < 2:
            # nanochat's --device-batch-size=1: one sequence of 512 tokens a forward
            return MemoryNotMeasured(
                "the captured batch is one row, so no smaller batch was measured (shorter rows, such as a shorter "
                "sequence, activation checkpointing or bf16 make such a step smaller)"
            )
        if fit is None:
            return MemoryNotMeasured("no halving of the captured batch fit")
        return _fit(ctx, fit)
    memory = ctx.step_memory
    if memory is None and ctx.memory_failed is not None:
        return MemoryNotMeasured(f"one step of copies of the captured model failed: {ctx.memory_failed}")
    if memory is None:
        return MemoryNotMeasured("no model and batch were captured")
    return _step(ctx, memory, ctx.capture.batch_size if ctx.capture is not None else None)


def memory_lines(section: MemorySection) -> list[str]:
    """The section in a few terminal lines."""
    if not isinstance(section, MemoryMeasured):
        return [f"Memory: {section.reason}."]
    parts = section.parts
    rows = f" at {section.rows} rows" if section.rows else ""
    lines = [
        f"Memory: peak {size_text(section.peak_bytes)} in the {section.peak_phase}{rows} on {section.device} "
        f"(measured on copies, one step)",
        "  parameters {} · gradients {} · optimizer state {} · activations {} · temporaries {} · batch {}".format(
            size_text(parts.parameters + parts.buffers),
            size_text(parts.gradients),
            size_text(parts.optimizer_state),
            size_text(parts.activations),
            size_text(parts.temporaries),
            size_text(parts.inputs),
        ),
        f"  allocator beyond live tensors: {size_text(section.allocator_beyond_live_bytes)} · "
        + ("device total" if section.memory_limit_bytes is None else "limit (--memory-limit)")
        + f" {size_text(section.device_total_bytes)}, headroom {size_text(section.headroom_bytes)}",
    ]
    top = section.top_modules
    if top:
        lines.append("  saved for backward: " + "; ".join(_module_text(m) for m in top[:3]))
    fit = section.fit
    if fit is not None:
        lines.append(
            f"  the script's {fit.full_rows} rows need ~{size_text(fit.estimated_bytes_at_full_batch)} "
            f"(estimated) of {size_text(fit.capacity_bytes)}; fixes measured at {section.rows} rows:"
        )
        for fix in fit.fixes:
            lines.append(
                f"    {fix.fix} {fix.detail}: ~{size_text(fix.estimated_bytes_at_full_batch)} "
                f"({'fits' if fix.fits else 'does not fit'}), step {fix.baseline_ms:.1f} -> "
                f"{fix.fixed_ms:.1f} ms"
            )
        for name in fit.fixes_out_of_memory:
            lines.append(f"    {name}: ran out of memory at {section.rows} rows (does not fit)")
    return lines
