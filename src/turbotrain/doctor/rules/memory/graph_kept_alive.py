"""`graph-kept-alive`: a step's autograd graph kept alive across steps (a loss kept in a list, a running sum without
`.detach()`): the tensors with a graph counted at a few step boundaries off the measured steps grow at every one;
names the variable and the line that adds to it, with the tensors, graph nodes and bytes kept per step.

Reads: run.
Edit: `.detach()` on what the loop keeps at the line the holder grew: `losses.append(loss.detach())`, `total += (a +
b).detach()` (the same values; by hand where the line keeps something else, or `extend`s a list).

The recorder counts the tensors with a ``grad_fn`` alive at a few step boundaries off the measured steps
(:mod:`~turbotrain.doctor.record.graph_watch`); a clean loop holds the same few at every boundary, one that keeps
its losses one more each step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...edits import EditSpec
from ...analysis.memory import size_text
from ...findings import Evidence, Finding, Fix
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context

# Graph bytes kept per step from which the leak is worth more than a low finding (a million steps: 1 TB).
SERIOUS_BYTES_PER_STEP = 2**20


@dataclass(frozen=True)
class GraphGrowthEvidence(Evidence):
    """At the step boundaries counted: the tensors with a graph alive, their graph nodes and bytes."""

    holder: str  # the script's variable that keeps them ("": not known)
    steps: tuple[int, ...]
    tensors: tuple[int, ...]
    nodes: tuple[int, ...]
    bytes: tuple[int, ...]
    tensors_per_step: float
    nodes_per_step: float
    bytes_per_step: float


def graph_kept_alive(ctx: Context) -> Iterator[Finding]:
    growth = ctx.recording.graph_growth if ctx.recording is not None else None
    if growth is None or not growth.growing or growth.tensors_per_step <= 0:
        return
    holder = f"`{growth.holder}`" if growth.holder else "a variable of the script"
    kept = (
        f"{growth.tensors_per_step:.2g} tensor(s) with their graph, {growth.nodes_per_step:.2g} graph node(s) and "
        f"{size_text(growth.bytes_per_step)} of tensors a step"
    )
    freed = (
        " The backward already freed what those graphs saved, so the bytes are small; the graph nodes and the "
        "Python objects still pile up, and a kept output that never goes through a backward keeps its activations."
        if growth.bytes_per_step < SERIOUS_BYTES_PER_STEP
        else ""
    )
    f = Finding(
        "graph-kept-alive",
        site=growth.site,
        message=(
            f"{holder} keeps each step's autograd graph alive: at steps {', '.join(map(str, growth.steps))} the "
            f"tensors with a graph went {' -> '.join(map(str, growth.tensors))}, {kept} more.{freed}"
        ),
        fix=Fix(
            f"keep the number, not the graph: {growth.holder or 'losses'}.append(loss.item()) (one sync a step) or "
            ".append(loss.detach()); a running sum: total += loss.detach()",
            lightning="self.log('train_loss', loss) keeps the value for you; keep loss.detach() if you must",
            hf_trainer="the Trainer logs the loss itself: keep loss.detach() in your own callbacks",
        ),
        evidence=GraphGrowthEvidence.read(growth),
    )
    f.provisional("medium" if growth.bytes_per_step >= SERIOUS_BYTES_PER_STEP else "low")
    f.note = "Memory, not speed: it grows with every step until the run ends or runs out."
    yield f


def edit(ctx: Context, f: Finding) -> EditSpec:
    """``.detach()`` on what the loop keeps at the line the holder grew: the same values, no graph."""
    holder = f.evidence_as(GraphGrowthEvidence).holder
    return EditSpec("detach", f"{holder or 'what the loop keeps'}: keep .detach(), not the graph", {"holder": holder})


RULE = register(Rule("graph-kept-alive", detect=(Detect("runtime", graph_kept_alive),), edit=edit))
