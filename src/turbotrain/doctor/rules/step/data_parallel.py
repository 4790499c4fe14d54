"""`data-parallel`: `nn.DataParallel`.

Reads: model, source.
Applies to: a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from torch import nn

from ...findings import Evidence, Finding, Fix, speedup_for_rule
from ..common import sources, static_finding
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


@dataclass(frozen=True)
class DataParallelEvidence(Evidence):
    gpus: int


def data_parallel(ctx: Context) -> Iterator[Finding]:
    for module in [ctx.model, *ctx.modules]:
        if isinstance(module, nn.DataParallel):
            gpus = ctx.hw.device_count if ctx.on_gpu else 0
            f = Finding(
                "data-parallel",
                site=ctx.module_site(module),
                category="compute",
                speedup=speedup_for_rule("data-parallel"),
                message=(
                    "nn.DataParallel runs all GPUs from one Python process: every step it replicates the model, "
                    "scatters the batch and gathers the outputs on GPU 0, all under one GIL."
                ),
                fix=Fix(
                    "DistributedDataParallel, one process per GPU: `turbotrain launch --nproc-per-node N "
                    "train.py` or `torchrun --nproc-per-node N train.py` with DDP(model)",
                    plan={"strategy": "ddp"},
                    lightning="Trainer(strategy='ddp', devices=N)",
                    accelerate="accelerate launch --multi_gpu --num_processes N train.py",
                    fabric="Fabric(strategy='ddp', devices=N)",
                    hf_trainer="torchrun --nproc-per-node N train.py (the Trainer then runs DDP itself)",
                ),
                evidence=DataParallelEvidence(gpus=gpus),
            )
            f.provisional("high" if gpus >= 2 else "medium")
            yield f.on_cpu(ctx)
            return


def data_parallel_static(ctx: Context) -> Iterator[Finding]:
    for index in sources(ctx):
        for call, _ in index.calls("DataParallel"):
            yield static_finding(
                "data-parallel",
                index,
                call,
                "nn.DataParallel drives all GPUs from one process (replicate, scatter, gather every step).",
                Fix(
                    "DistributedDataParallel with one process per GPU (torchrun / turbotrain launch)",
                    plan={"strategy": "ddp"},
                ),
                speedup=speedup_for_rule("data-parallel"),
            ).on_cpu(ctx)


RULE = register(
    Rule(
        "data-parallel",
        detect=(
            Detect("live", data_parallel),
            Detect("static", data_parallel_static),
        ),
    )
)
