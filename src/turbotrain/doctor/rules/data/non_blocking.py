"""`non-blocking`: blocking host-to-device copies.

Reads: run, source.
Applies to: a GPU.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ...analysis.source import dotted_name, is_const, keyword
from ...findings import Evidence, Finding, Fix, speedup_for_rule
from ..common import ms, sources, static_finding
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class BlockingCopyEvidence(Evidence):
    per_step: float
    mib_per_step: float


def non_blocking(ctx: Context) -> Iterator[Finding]:
    if not ctx.on_gpu:
        return  # on the CPU there is no copy; the static rule notes GPU scripts
    blocking = [s for s in ctx.ran_sites("h2d") if not s.detail.get("non_blocking")]
    total = sum(s.seconds_per_step for s in ctx.site_stats("h2d")) or 1e-12
    for stat in blocking[:3]:
        share = ctx.share("host_to_device") * stat.seconds_per_step / total
        pinned = stat.detail.get("pinned")
        f = Finding(
            "non-blocking",
            site=stat.site,
            category="host_to_device",
            speedup=speedup_for_rule("non-blocking", "device_prefetch"),
            message=(
                f"This copy to the GPU blocks the host {stat.per_step:g}x per step "
                f"({stat.bytes_per_step / 2**20:.1f} MiB, {ms(stat.seconds_per_step)} per step)"
                + ("." if pinned else "; its source is pageable memory, so pin it first (pin-memory).")
            ),
            fix=Fix(
                "tensor.to(device, non_blocking=True) from pinned memory; or prefetch the next batch on a side stream",
                plan={"device_prefetch": True, "pin_memory": True},
                lightning="automatic (Lightning moves batches with non_blocking when pinned)",
                accelerate="Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))",
            ),
            evidence=BlockingCopyEvidence(per_step=stat.per_step, mib_per_step=round(stat.bytes_per_step / 2**20, 3)),
        )
        f.set_gain(share, measured=False)
        f.note = "est_speedup is the upper bound: the copy fully overlapped with compute."
        yield f


def non_blocking_static(ctx: Context) -> Iterator[Finding]:
    if ctx.on_gpu:
        return  # measured by the runtime rule
    for index in sources(ctx):
        if not index.mentions_cuda:
            continue
        for call, name in index.calls("to", "cuda"):
            if not isinstance(call.func, ast.Attribute) or not index.in_direct_loop(call):
                continue
            if call.func.attr == "to" and not call.args:
                continue
            if (
                call.func.attr == "to"
                and isinstance(call.args[0], ast.Attribute)
                and "dtype" not in dotted_name(call.args[0])
                and dotted_name(call.args[0]).startswith("torch.")
            ):
                continue  # .to(torch.float16): a dtype, not a device
            nb = keyword(call, "non_blocking")
            if nb is None or is_const(nb, False):
                f = static_finding(
                    "non-blocking",
                    index,
                    call,
                    f"{name}(...) copies to the GPU synchronously inside the loop: the host waits for each "
                    "copy instead of queuing it behind the running kernels.",
                    Fix(
                        ".to(device, non_blocking=True) with DataLoader(pin_memory=True)",
                        plan={"non_blocking": True, "pin_memory": True},
                    ),
                    speedup=speedup_for_rule("non-blocking", "non_blocking"),
                )
                yield f.on_cpu(ctx)


RULE = register(
    Rule(
        "non-blocking",
        detect=(
            Detect("runtime", non_blocking),
            Detect("static", non_blocking_static),
        ),
    )
)
