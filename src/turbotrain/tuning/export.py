"""A Plan for people on other frameworks: YAML, Lightning Trainer flags, an Accelerate config.

Each framework has flags for some switches (precision, accumulation, cudnn.benchmark,
strategy, compile in Accelerate) and none for others (channels_last, fused optimizers,
DataLoader settings): those come out as the lines of code that do the same, so nothing
the tuner found is silently dropped. What each switch writes is declared by its own
registry entry (``Speedup.export``, see :mod:`turbotrain.speedups.policy`); this module
only adds the device and the frameworks' boilerplate, walking the registry in order.
A plan a framework cannot express raises :class:`ExportError`, saying what to do instead.
"""

from __future__ import annotations

from typing import Any

import yaml

from ..plan import Plan
from ..speedups.policy import ExportError
from ..speedups.registry import all_speedups

__all__ = [
    "plan_yaml",
    "lightning_flags",
    "lightning_snippet",
    "accelerate_config",
    "accelerate_yaml",
    "code_changes",
    "dataloader_kwargs",
    "ExportError",
]


def plan_yaml(plan: Plan, header: str | None = None) -> str:
    """The plan as YAML (``tt.Plan.from_yaml`` reads it back), with an optional comment header."""
    lines = "".join(f"# {line}\n" for line in header.splitlines()) if header else ""
    return lines + plan.to_yaml()


def dataloader_kwargs(plan: Plan) -> dict[str, Any]:
    """The DataLoader arguments the plan sets (those left as None keep the user's)."""
    keys = {e.export.dataloader: e.field for e in all_speedups() if e.export.dataloader}
    return {k: getattr(plan, f) for k, f in keys.items() if getattr(plan, f) is not None}


def code_changes(plan: Plan, framework: str) -> list[str]:
    """Lines of code for the switches a framework has no flag for, in the order ``prepare`` applies them,
    the DataLoader's arguments last."""
    lines = [line for entry in all_speedups() for line in entry.export.code_lines(plan, framework)]
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
    flags: dict[str, Any] = {"accelerator": accelerator, "devices": devices}
    for entry in all_speedups():
        flags.update(entry.export.lightning_flags(plan))
    return flags


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
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "gpu_ids": "all",
        "machine_rank": 0,
        "main_training_function": "main",
        "num_machines": 1,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": cpu,
    }
    for entry in all_speedups():  # distributed_type and num_processes, mixed_precision, dynamo_config
        config.update(entry.export.accelerate_keys(plan))
    return config


def accelerate_yaml(plan: Plan) -> str:
    """The Accelerate config as YAML, with the code-side switches as comments above it."""
    head = [
        f"# turbotrain plan as an Accelerate config: {plan.describe()}",
        "# use: accelerate launch --config_file THIS_FILE train.py",
    ]
    code = code_changes(plan, "accelerate")
    if code:
        head.append("# in train.py (no config key for these):")
        head += [f"#   {line}" for line in code]
    return "\n".join(head) + "\n" + yaml.safe_dump(accelerate_config(plan), sort_keys=True)
