"""Non-blocking host-to-device copies: the host queues the copy and goes on."""

from __future__ import annotations

from .registry import BenchEntry, Order, Speedup, register


def _apply(rt) -> None:
    rt.non_blocking = True


def _requires(hw, plan) -> str | None:
    return None if hw.is_cuda else "there is no host-to-device copy when training on the CPU"


def _recommend(hw, info):
    return True if hw.is_cuda else None


ENTRY = register(Speedup(
    name="non_blocking", field="non_blocking", order=Order.STEP, apply=_apply, requires=_requires,
    recommend=_recommend, exact=True, doctor_rules=("non-blocking",),
    summary="copies overlap with work already queued on the GPU",
    bench=BenchEntry(("cnn",), {"non_blocking": True, "pin_memory": True}),
))
