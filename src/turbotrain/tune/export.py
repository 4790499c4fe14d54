"""A Plan for people on other frameworks: YAML, Lightning Trainer flags, an Accelerate config.

Each framework has flags for some switches (precision, accumulation, cudnn.benchmark,
strategy, compile in Accelerate) and none for others (channels_last, fused optimizers,
DataLoader settings): those come out as the lines of code that do the same, so nothing
the tuner found is silently dropped.
"""

from __future__ import annotations

from typing import Any

import yaml

from ..plan import Plan

__all__ = ["plan_yaml", "lightning_flags", "lightning_snippet", "accelerate_config", "accelerate_yaml",
           "code_changes", "dataloader_kwargs"]

_LIGHTNING_PRECISION = {"fp32": "32-true", "bf16-mixed": "bf16-mixed", "fp16-mixed": "16-mixed",
                        "bf16-true": "bf16-true"}
_ACCELERATE_PRECISION = {"fp32": "no", "bf16-mixed": "bf16", "fp16-mixed": "fp16", "bf16-true": "bf16"}


def plan_yaml(plan: Plan, header: str | None = None) -> str:
    """The plan as YAML (``tt.Plan.from_yaml`` reads it back), with an optional comment header."""
    lines = "".join(f"# {line}\n" for line in header.splitlines()) if header else ""
    return lines + plan.to_yaml()


def dataloader_kwargs(plan: Plan) -> dict[str, Any]:
    """The DataLoader arguments the plan sets (those left as None keep the user's)."""
    keys = ("batch_size", "num_workers", "pin_memory", "persistent_workers")
    return {k: getattr(plan, k) for k in keys if getattr(plan, k) is not None}


def code_changes(plan: Plan, framework: str) -> list[str]:
    """Lines of code for the switches a framework has no flag for."""
    lines = []
    if plan.tf32:
        lines.append('torch.set_float32_matmul_precision("high")  # TF32 matmuls')
    if plan.intra_op_threads is not None:
        lines.append(f"torch.set_num_threads({plan.intra_op_threads})  # intra-op CPU threads; or "
                     f"OMP_NUM_THREADS={plan.intra_op_threads} in the environment")
    if plan.drop_conv_bias:
        lines.append("from turbotrain.speedups.drop_conv_bias import drop_conv_bias_before_bn; "
                     "drop_conv_bias_before_bn(model)  # before building the optimizer")
    if plan.channels_last:
        lines.append("model = model.to(memory_format=torch.channels_last)  # and images: "
                     "x.contiguous(memory_format=torch.channels_last)")
    if plan.precision == "bf16-true" and framework == "accelerate":
        lines.append("model = model.to(torch.bfloat16)  # bf16 weights (the config's bf16 is autocast)")
    if plan.compile is not False and framework == "lightning":
        lines.append(f'model = torch.compile(model, mode="{plan.compile_mode}")  # before trainer.fit')
    if plan.fused_optimizer:
        lines.append("optimizer = torch.optim.AdamW(params, ..., fused=True)  # or foreach=True where "
                     "there is no fused kernel")
    if not plan.set_to_none:
        lines.append("optimizer.zero_grad(set_to_none=False)")
    if plan.grad_accum_steps > 1 and framework == "accelerate":
        lines.append(f"accelerator = Accelerator(gradient_accumulation_steps={plan.grad_accum_steps})")
    loader = dataloader_kwargs(plan)
    if loader:
        lines.append("DataLoader(dataset, " + ", ".join(f"{k}={v!r}" for k, v in loader.items()) + ")")
    return lines


def _device(plan: Plan) -> tuple[str, Any]:
    if plan.device == "auto":
        return "auto", "auto"
    if plan.device == "cpu":
        return "cpu", 1
    index = plan.device.partition(":")[2]
    return "gpu", [int(index)] if index else 1


def lightning_flags(plan: Plan) -> dict[str, Any]:
    """Keyword arguments for ``lightning.pytorch.Trainer`` equivalent to the plan's Trainer-level switches."""
    accelerator, devices = _device(plan)
    return {
        "accelerator": accelerator,
        "devices": devices,
        "strategy": plan.strategy,
        "precision": _LIGHTNING_PRECISION[plan.precision],
        "accumulate_grad_batches": plan.grad_accum_steps,
        "benchmark": plan.cudnn_benchmark,
        "sync_batchnorm": bool(plan.sync_batchnorm),
    }


def lightning_snippet(plan: Plan) -> str:
    """Python text: the Trainer call plus the code for switches Lightning has no flag for."""
    flags = ", ".join(f"{k}={v!r}" for k, v in lightning_flags(plan).items())
    lines = ["# turbotrain plan as Lightning: " + plan.describe(), "import lightning as L", "import torch", ""]
    lines += code_changes(plan, "lightning")
    lines.append(f"trainer = L.Trainer({flags})")
    return "\n".join(lines) + "\n"


def accelerate_config(plan: Plan) -> dict[str, Any]:
    """An ``accelerate config`` file's content (what ``accelerate launch --config_file`` reads)."""
    cpu = plan.device == "cpu"
    distributed = {"auto": "NO", "ddp": "MULTI_CPU" if cpu else "MULTI_GPU", "fsdp": "FSDP"}[plan.strategy]
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": distributed,
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "gpu_ids": "all",
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": _ACCELERATE_PRECISION[plan.precision],
        "num_machines": 1,
        "num_processes": 1,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": cpu,
    }
    if plan.compile is not False:
        config["dynamo_config"] = {"dynamo_backend": "INDUCTOR", "dynamo_mode": plan.compile_mode,
                                   "dynamo_use_dynamic": False, "dynamo_use_fullgraph": False}
    if plan.strategy != "auto":
        del config["num_processes"]  # one per device, chosen at launch (--num_processes)
    return config


def accelerate_yaml(plan: Plan) -> str:
    """The Accelerate config as YAML, with the code-side switches as comments above it."""
    head = [f"# turbotrain plan as an Accelerate config: {plan.describe()}",
            "# use: accelerate launch --config_file THIS_FILE train.py"]
    code = code_changes(plan, "accelerate")
    if code:
        head.append("# in train.py (no config key for these):")
        head += [f"#   {line}" for line in code]
    return "\n".join(head) + "\n" + yaml.safe_dump(accelerate_config(plan), sort_keys=True)
