"""`tensors-kept`: a list, dict or deque of the script's holds more tensors, and more bytes, at every step boundary
counted (off the measured steps): outputs gathered for a metric, a history kept on the device; names the variable
and the line that adds to it, the bytes kept per step and what 100,000 steps keep (tensors that carry their graph
are `graph-kept-alive`'s).

Reads: run.

At the few step boundaries where the recorder counts the graphs alive (off the measured steps), it also counts the
tensors each list, dict or deque of the user's frames holds (:mod:`~turbotrain.doctor.record.graph_watch`); a
container holding more, and more bytes, at every one grows with the run. Tensors that carry their graph are
``graph-kept-alive``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...findings import Evidence, Finding, Fix
from ..rule import Detect, Rule, register
from ._text import size_text

if TYPE_CHECKING:
    from ...analysis.context import Context

# Bytes kept per step from which the growth is worth more than a low finding (a million steps: 1 TB).
SERIOUS_BYTES_PER_STEP = 2**20


@dataclass(frozen=True)
class TensorGrowthEvidence(Evidence):
    """At the step boundaries counted: the tensors the container held, and their bytes."""

    holder: str
    device: str
    steps: tuple[int, ...]
    tensors: tuple[int, ...]
    bytes: tuple[int, ...]
    bytes_per_step: float


def tensors_kept(ctx: Context) -> Iterator[Finding]:
    growth = ctx.recording.tensor_growth if ctx.recording is not None else None
    graphs = ctx.recording.graph_growth if ctx.recording is not None else None
    if growth is None or growth.bytes_per_step <= 0:
        return
    if growth.with_graphs and graphs is not None and graphs.growing and graphs.holder == growth.holder:
        return  # the graphs they carry are graph-kept-alive's finding, which frees these bytes too
    per_step = growth.bytes_per_step
    f = Finding(
        "tensors-kept",
        site=growth.site,
        message=(
            f"`{growth.holder}` keeps tensors from every step, {size_text(per_step)} a step on {growth.device}: at "
            f"steps {', '.join(map(str, growth.steps))} it held {' -> '.join(map(str, growth.tensors))} tensors "
            f"({' -> '.join(size_text(b) for b in growth.bytes)}). Memory that grows with the run: 100,000 steps "
            f"keep {size_text(per_step * 100_000)}."
        ),
        fix=Fix(
            f"keep what you need as it comes instead of every tensor: a running sum or count, a metric updated "
            f"each step (torchmetrics' update/compute), or {growth.holder}.clear() once it is used (each epoch); "
            "on a GPU, .cpu() what you must keep",
            lightning="log the value with self.log(...) or update a torchmetrics metric in training_step: "
            "nothing kept across steps",
            hf_trainer="compute_metrics sees what the evaluation gathers: keep nothing across training steps",
        ),
        evidence=TensorGrowthEvidence.read(growth),
    )
    f.provisional("medium" if per_step >= SERIOUS_BYTES_PER_STEP else "low")
    f.note = "Memory, not speed: it grows with every step until the run ends or runs out."
    yield f


RULE = register(Rule("tensors-kept", detect=(Detect("runtime", tensors_kept),)))
