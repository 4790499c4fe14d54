"""`save-in-loop`: `torch.save` in the step (timed).

Reads: run, source.
Edit: `if (step + 1) % N == 0:` around a per-step `torch.save`, `N` from its measured cost.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...analysis.periodic import suggested_every
from ...edits import ByHand, EditSpec
from ...findings import Evidence, Finding, Fix
from ..common import ms, ran_per_step, sources, static_finding, timed_sites
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class SaveEvidence(Evidence):
    per_step: float
    ms_per_step: float


def save_in_loop(ctx: Context) -> Iterator[Finding]:
    for stat, share in timed_sites(ctx, "save"):
        f = Finding(
            "save-in-loop",
            site=stat.site,
            category="outside_step",
            message=(
                f"torch.save runs {stat.per_step:g}x per step here ({ms(stat.seconds_per_step / stat.per_step)} "
                f"each, {share:.0%} of step time)."
            ),
            fix=Fix(
                "Checkpoint every N steps or once per epoch, in the background when it is large "
                "(turbotrain.train.checkpoint writes atomically)",
                lightning="ModelCheckpoint(every_n_train_steps=N)",
                accelerate="accelerator.save_state(...) every N steps",
                fabric="fabric.save(path, state) every N steps",
                hf_trainer="TrainingArguments(save_steps=N)",
            ),
            evidence=SaveEvidence(per_step=stat.per_step, ms_per_step=round(stat.seconds_per_step * 1e3, 3)),
        )
        f.set_gain(share, measured=True)
        yield f


def save_in_loop_static(ctx: Context) -> Iterator[Finding]:
    for index in sources(ctx):
        for call, _ in index.calls("torch.save"):
            if not index.in_direct_loop(call):
                continue
            guarded = False
            parent = index.parents.get(call)
            while parent is not None and not isinstance(parent, (ast.For, ast.While)):
                if isinstance(parent, ast.If):
                    guarded = True
                parent = index.parents.get(parent)
            if parent is not None and _holds_the_step_loop(parent):
                continue  # an epoch loop around the step loop: a save per epoch is the fix itself
            if not guarded and not ran_per_step(ctx, "save", index.site(call)):
                yield static_finding(
                    "save-in-loop",
                    index,
                    call,
                    "torch.save runs on every iteration of this loop.",
                    Fix("save every N steps or once per epoch"),
                )


_STEP_CALLS = ("backward", "step")


def _holds_the_step_loop(loop: ast.AST) -> bool:
    """Whether a loop nested in ``loop`` (not ``loop`` itself) calls ``.backward()`` or ``.step()``: then ``loop``
    runs once per pass over the steps (an epoch), not once per step."""
    inner = [n for n in ast.walk(loop) if n is not loop and isinstance(n, (ast.For, ast.While))]
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _STEP_CALLS
        for nested in inner
        for node in ast.walk(nested)
    )


def edit(ctx: Context, f: Finding) -> EditSpec:
    timed = f.evidence if isinstance(f.evidence, SaveEvidence) else None  # None: the static finding's
    per_step = (timed.per_step if timed else 0.0) or 1.0
    if per_step > 1.0:
        raise ByHand("torch.save runs more than once per step here; checkpoint less often by hand")
    cost_s = (timed.ms_per_step if timed else 0.0) / 1e3 / per_step
    every = max(2, suggested_every(cost_s, max(ctx.step_s - cost_s, 1e-6), 1))
    return EditSpec("save_every", f"torch.save every {every} steps (was every step)", params={"every": every})


RULE = register(
    Rule(
        "save-in-loop",
        detect=(
            Detect("runtime", save_in_loop),
            Detect("static", save_in_loop_static),
        ),
        edit=edit,
    )
)
