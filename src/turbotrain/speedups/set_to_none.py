"""zero_grad(set_to_none=True): drop gradients rather than writing zeros into them."""

from __future__ import annotations

from .registry import BenchEntry, Order, Speedup, register


def zero_grad(optimizer, set_to_none: bool = True) -> None:
    """With set_to_none the next backward allocates fresh gradients instead of adding to zeros."""
    optimizer.zero_grad(set_to_none=set_to_none)


def _apply(rt) -> None:
    rt.set_to_none = rt.plan.set_to_none


# torch's own default is set_to_none=True, so the naive plan already has it: the switch is
# "active" only when a plan turns it off, and the benchmark measures what turning it off costs.
ENTRY = register(Speedup(
    name="set_to_none", field="set_to_none", order=Order.STEP, apply=_apply, exact=True,
    doctor_rules=("zero-grad-not-none",),
    summary="no memset of every gradient each step",
    bench=BenchEntry(("mlp",), {"set_to_none": False}),
))
