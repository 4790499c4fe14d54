"""Data parallelism across processes: DistributedDataParallel (never DataParallel) or FSDP."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .. import distributed as tdist
from ..config import ConfigError
from .model_info import ANY_MODEL
from .policy import Export, ExportError, not_tuned
from .registry import BenchEntry, Order, Speedup, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime import Runtime


def resolve_strategy(strategy: str) -> str:
    """'auto' -> 'ddp' when launched with several processes, else 'none'. A pipeline also runs in one process
    started alone (as one stage: the same numbers), so a script runs unchanged with and without a launcher."""
    if strategy == "auto":
        return "ddp" if tdist.world_size() > 1 else "none"
    if strategy == "pipeline":
        return strategy
    if not tdist.is_launched():
        raise ConfigError(
            f"Plan.strategy='{strategy}' needs several processes started by a launcher, and this "
            f"process was started alone. Run it as `turbotrain launch --nproc-per-node N your_script.py ...` "
            f"(or `torchrun --nproc-per-node N your_script.py ...`), or use strategy='auto' for one process."
        )
    return strategy


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.parallel.DistributedDataParallel:
    """DDP over the current process group (NCCL on CUDA, gloo on CPU)."""
    tdist.init_process_group(device)
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


def _device_of_this_rank(rt: Runtime) -> None:
    """Plan(device='cuda') names no index: under a launcher each process takes the GPU of its local rank."""
    if rt.device.type == "cuda" and rt.device.index is None:
        rt.device = torch.device("cuda", tdist.local_rank() % torch.cuda.device_count())
        if rt.plan.strategy != "pipeline":  # a pipeline moves only its own stages' layers
            rt.module.to(rt.device)  # in place: parameters (and the optimizers' references) stay the same objects


def _apply(rt: Runtime) -> None:
    strategy = resolve_strategy(rt.plan.strategy)
    if strategy == "none":
        return
    _device_of_this_rank(rt)
    if strategy == "ddp":
        rt.ddp = wrap_ddp(rt.model, rt.device)
        rt.model = rt.ddp
    elif strategy == "fsdp":
        from ..launch.fsdp import apply_to_runtime

        apply_to_runtime(rt)
    elif strategy == "pipeline":
        from ..launch.pipeline import apply_to_runtime as apply_pipeline

        apply_pipeline(rt)


def _is_active(plan) -> bool:
    return plan.strategy != "auto" or tdist.world_size() > 1


def _no_pipeline_export(plan, framework: str) -> None:
    if plan.strategy == "pipeline":
        raise ExportError(
            f"Plan.strategy='pipeline' has no {framework} equivalent: {framework} has no strategy that splits "
            "a model into torch.distributed.pipelining stages (Accelerate's pipeline parallelism goes through "
            "Megatron-LM or DeepSpeed). Run this plan with turbotrain itself (save it with plan_yaml(plan) and "
            "start `turbotrain launch --nproc-per-node N train.py`), or export a plan with strategy='ddp' or 'fsdp'."
        )


def _lightning(plan) -> dict:
    _no_pipeline_export(plan, "Lightning")
    return {"strategy": plan.strategy}


def _accelerate(plan) -> dict:
    _no_pipeline_export(plan, "Accelerate")
    if plan.strategy == "auto":
        return {"distributed_type": "NO", "num_processes": 1}
    # No num_processes: one per device, chosen at launch (--num_processes).
    multi = "MULTI_CPU" if plan.device == "cpu" else "MULTI_GPU"
    return {"distributed_type": {"ddp": multi, "fsdp": "FSDP"}[plan.strategy]}


ENTRY = register(
    Speedup(
        name="strategy",
        field="strategy",
        order=Order.MODEL_WRAP,
        apply=_apply,
        is_active=_is_active,
        exact=True,
        doctor_rules=("data-parallel", "nccl-env"),
        summary="one process per GPU with overlapped gradient all-reduce (DDP), sharded state (FSDP), or the model "
        "split into stages across processes (pipeline, alone or x FSDP)",
        settings=("pipeline_stages", "microbatches", "schedule", "stages_per_process"),
        bench=BenchEntry(("mlp",), {"strategy": "ddp"}, script="benchmarks/ddp.py"),
        applies_to=ANY_MODEL,
        export=Export(lightning=_lightning, accelerate=_accelerate),
        tune=not_tuned(
            "decided by how the job is launched (one process or torchrun), not per model: DDP, FSDP and a "
            "pipeline need several processes, so one device never gets them"
        ),
    )
)
