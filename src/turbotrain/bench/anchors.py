"""Published figures to hold a GPU run against, and where a result stands next to them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .results import BenchResult, Row

__all__ = ["Anchor", "ANCHORS", "compare_to_anchors"]


@dataclass(frozen=True)
class Anchor:
    workload: str
    metric: str  # "units_per_s" or "mfu"
    value: float
    source: str


ANCHORS = (
    Anchor("cnn", "units_per_s", 2470, "NVIDIA DeepLearningExamples ResNet-50 v1.5, AMP + channels_last, one A100"),
    Anchor("cnn", "units_per_s", 938, "NVIDIA DeepLearningExamples ResNet-50 v1.5, TF32, one A100"),
    Anchor("gpt", "mfu", 0.41, "llm.c GPT-2 124M, one H100"),
    Anchor("gpt", "mfu", 0.36, "torchtitan Llama-3 8B without FP8, H100 (33-39%; a larger model, easier to fill)"),
)


def _best(rows: list["Row"], metric: str) -> "Row | None":
    scored = [r for r in rows if r.measured and r.path == "resident" and getattr(r, metric) is not None]
    return max(scored, key=lambda r: getattr(r, metric), default=None)


def compare_to_anchors(result: "BenchResult") -> list[str]:
    """One line per anchor for the GPU-scale workloads of ``result`` (nothing for CPU-scale runs)."""
    lines = []
    device = result.machine["device"]
    for w in result.workloads:
        if w.scale != "gpu":
            continue
        for anchor in (a for a in ANCHORS if a.workload == w.name):
            best = _best(w.rows, anchor.metric)
            if best is None:
                lines.append(f"{w.name}: no measured {anchor.metric} to hold against {anchor.source}")
                continue
            ours = getattr(best, anchor.metric)
            shown = f"{ours * 100:.1f}% MFU" if anchor.metric == "mfu" else f"{ours:,.0f} {w.unit}/s"
            theirs = f"{anchor.value * 100:.0f}% MFU" if anchor.metric == "mfu" else f"{anchor.value:,.0f} {w.unit}/s"
            lines.append(
                f"{w.name}: best plan '{best.label}' reaches {shown} on {device}, {ours / anchor.value:.2f}x "
                f"the {theirs} of {anchor.source}"
            )
    return lines
