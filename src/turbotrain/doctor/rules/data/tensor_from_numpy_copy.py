"""`tensor-from-numpy-copy`: `torch.tensor(ndarray)` per step (timed).

Reads: run, source.
Edit: `torch.from_numpy(a)` for `torch.tensor(a)` (`torch.as_tensor(a, dtype=...)` when a dtype is given).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...edits import ByHand, EditSpec
from ...findings import Evidence, Finding, Fix
from ..common import ms, ran_per_step, sources, static_finding, timed_sites
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class NumpyCopyEvidence(Evidence):
    per_step: float
    mib_per_step: float
    ms_per_step: float


def tensor_from_numpy(ctx: Context) -> Iterator[Finding]:
    for stat, share in timed_sites(ctx, "tensor_copy"):
        f = Finding(
            "tensor-from-numpy-copy",
            site=stat.site,
            category="data_loading",
            message=(
                f"torch.tensor() copies a NumPy array here {stat.per_step:g}x per step "
                f"({stat.bytes_per_step / 2**20:.2f} MiB, {ms(stat.seconds_per_step)} per step)."
            ),
            fix=Fix(
                "torch.from_numpy(array) (or torch.as_tensor(array)) shares the array's memory instead of "
                "copying it; when the data never changes, convert it once before the loop."
            ),
            evidence=NumpyCopyEvidence(
                per_step=stat.per_step,
                mib_per_step=round(stat.bytes_per_step / 2**20, 4),
                ms_per_step=round(stat.seconds_per_step * 1e3, 4),
            ),
        )
        f.set_gain(share, measured=True)
        yield f


def numpy_copy_static(ctx: Context) -> Iterator[Finding]:
    for index in sources(ctx):
        for call, _name in index.calls("torch.tensor"):
            if not call.args or isinstance(call.args[0], (ast.Constant, ast.List, ast.Tuple, ast.ListComp)):
                continue
            if not index.runs_per_step(call):
                continue
            site = index.site(call)
            if ran_per_step(ctx, "tensor_copy", site) or any(
                seen.file == site.file and seen.line == site.line for _, seen, _ in ctx.seen("tensor_")
            ):
                continue  # the runtime rule measured it, or the run saw what this line passes (not an array)
            yield static_finding(
                "tensor-from-numpy-copy",
                index,
                call,
                "torch.tensor(...) always copies its input; for a NumPy array torch.from_numpy shares the memory.",
                Fix("torch.from_numpy(array) or torch.as_tensor(array)"),
            )


def edit(ctx: Context, f: Finding) -> EditSpec:
    if f.source == "static":
        raise ByHand("the run did not see what this line passes; torch.from_numpy takes only a NumPy array")
    return EditSpec("from_numpy", "torch.from_numpy(array) for torch.tensor(array)")


RULE = register(
    Rule(
        "tensor-from-numpy-copy",
        detect=(
            Detect("runtime", tensor_from_numpy),
            Detect("static", numpy_copy_static),
        ),
        edit=edit,
    )
)
