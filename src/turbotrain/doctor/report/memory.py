"""The report's memory section: the step's peak split into what holds it, the device's total and headroom; after
an out-of-memory error, the step at a batch that fits and the fixes measured there. Plain data for the JSON, and
its lines for the terminal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..analysis.memory import FitMeasure, capacity_bytes, size_text
from ..record.memory_watch import StepMemory

if TYPE_CHECKING:
    from ..analysis.context import Context

__all__ = ["memory_section", "memory_lines"]

TOP_MODULES = 5  # module rows in the section


def _step(ctx: Context, memory: StepMemory, rows: int | None) -> dict[str, Any]:
    peak, capacity = memory.peak, capacity_bytes(memory)
    return {
        "measured": True,
        "device": memory.device,
        "rows": rows,
        "peak_bytes": memory.peak_bytes,
        "peak_phase": memory.peak_phase,
        "parts": {
            "parameters": peak.parameters,
            "buffers": peak.buffers,
            "gradients": peak.gradients,
            "optimizer_state": peak.optimizer_state,
            "inputs": peak.inputs,
            "activations": peak.activations,
            "temporaries": peak.temporaries,
        },
        "saved_for_backward_bytes": memory.activation_bytes,
        # None: not known (the CPU's allocator does not say what it keeps beyond live tensors).
        "allocator_beyond_live_bytes": memory.allocator_held_bytes,
        "allocator_peak_bytes": memory.allocator_peak_bytes,
        "device_total_bytes": memory.memory.total_bytes,
        "device_free_bytes": memory.memory.free_bytes,
        "headroom_bytes": capacity - memory.peak_bytes if capacity is not None else None,
        "top_modules": [
            {
                "name": m.name or "(model)",
                "class": m.class_name,
                "bytes": m.total_bytes,
                "where": ctx.where(m.site),
            }
            for m in memory.modules
            if m.name
        ][:TOP_MODULES],
    }


def _fit(ctx: Context, fit: FitMeasure) -> dict[str, Any]:
    out = _step(ctx, fit.memory, fit.rows)
    out.update(
        full_rows=fit.full_rows,
        estimated_bytes_at_full_batch=fit.estimated_bytes,
        capacity_bytes=fit.capacity_bytes,
        fixes=[
            {
                "fix": e.cost.fix,
                "detail": e.cost.detail,
                "fixed_bytes": e.cost.fixed.peak_bytes,
                "baseline_ms": round(e.cost.baseline.step_seconds * 1e3, 3),
                "fixed_ms": round(e.cost.fixed.step_seconds * 1e3, 3),
                "estimated_bytes_at_full_batch": e.estimated_bytes,
                "fits": e.fits,
            }
            for e in fit.fixes
        ],
    )
    return out


def memory_section(ctx: Context) -> dict[str, Any]:
    """The section for ``ctx``'s run: measured (``"measured": True``), or why not."""
    if not ctx.memory_allowed:
        return {"measured": False, "reason": "not measured (--no-what-if)"}
    recording = ctx.recording
    if recording is not None and recording.out_of_memory is not None:
        fit = ctx.fit_after_oom
        if fit is None:
            return {"measured": False, "reason": "no halving of the captured batch fit"}
        return _fit(ctx, fit)
    memory = ctx.step_memory
    if memory is None:
        return {"measured": False, "reason": "no model and batch were captured"}
    return _step(ctx, memory, ctx.capture.batch_size if ctx.capture is not None else None)


def memory_lines(section: dict[str, Any]) -> list[str]:
    """The section in a few terminal lines."""
    if not section.get("measured"):
        return [f"Memory: {section.get('reason', 'not measured')}."]
    parts = section["parts"]
    rows = f" at {section['rows']} rows" if section.get("rows") else ""
    lines = [
        f"Memory: peak {size_text(section['peak_bytes'])} in the {section['peak_phase']}{rows} on {section['device']} "
        f"(measured on copies, one step)",
        "  parameters {} · gradients {} · optimizer state {} · activations {} · temporaries {} · batch {}".format(
            size_text(parts["parameters"] + parts["buffers"]),
            size_text(parts["gradients"]),
            size_text(parts["optimizer_state"]),
            size_text(parts["activations"]),
            size_text(parts["temporaries"]),
            size_text(parts["inputs"]),
        ),
        f"  allocator beyond live tensors: {size_text(section['allocator_beyond_live_bytes'])} · device total "
        f"{size_text(section['device_total_bytes'])}, headroom {size_text(section['headroom_bytes'])}",
    ]
    top = section.get("top_modules") or []
    if top:
        lines.append(
            "  saved for backward: "
            + "; ".join(
                f"{m['name']} ({m['class']}{', ' + m['where'] if m['where'] else ''}) {size_text(m['bytes'])}"
                for m in top[:3]
            )
        )
    if "fixes" in section:
        lines.append(
            f"  the script's {section['full_rows']} rows need ~{size_text(section['estimated_bytes_at_full_batch'])} "
            f"(estimated) of {size_text(section['capacity_bytes'])}; fixes measured at {section['rows']} rows:"
        )
        for fix in section["fixes"]:
            lines.append(
                f"    {fix['fix']} {fix['detail']}: ~{size_text(fix['estimated_bytes_at_full_batch'])} "
                f"({'fits' if fix['fits'] else 'does not fit'}), step {fix['baseline_ms']:.1f} -> "
                f"{fix['fixed_ms']:.1f} ms"
            )
    return lines
