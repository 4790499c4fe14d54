"""``turbotrain env``: what this machine can do: devices, interconnect, NCCL, precisions, compile,
and the CPU cores this process may really use (affinity, cgroup quota) against torch's threads."""

from __future__ import annotations

import os
import shutil
from typing import Any


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _nccl_version() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):  # a build without NCCL
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _compile_features(device_type: str) -> dict[str, Any]:
    """Whether torch.compile's default backend (inductor) can generate code here, and which modes apply."""
    import torch

    features: dict[str, Any] = {"available": hasattr(torch, "compile")}
    if device_type == "cuda":
        try:
            from torch.utils._triton import has_triton

            triton = has_triton()
        except ImportError:
            triton = False
        features["inductor"] = triton
        features["needs"] = None if triton else "triton (pip install triton) for GPU kernels"
        features["modes"] = ["default", "reduce-overhead", "max-autotune"] if triton else []
    else:
        compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++") or shutil.which("clang++")
        features["inductor"] = compiler is not None
        features["needs"] = None if compiler else "a C++ compiler (g++ or clang++) for CPU kernels"
        # reduce-overhead is CUDA graphs: on CPU it runs like 'default'.
        features["modes"] = ["default", "max-autotune-no-cudagraphs"] if compiler else []
    return features


def collect() -> dict[str, Any]:
    """Everything ``turbotrain env`` reports, as plain data."""
    import torch
    import torch.distributed as dist

    from ..hardware import cpu_facts, detect
    from ..launch.nccl import check_environment
    from ..launch.topology import detect_topology, infiniband_devices

    hw = detect()
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": hw.device_type,
        "device_name": hw.device_name,
        "gpu_count": len(gpus),
        "gpus": gpus,
        "cpu_cores": hw.cpu_cores,
        **cpu_facts(hw),  # usable cores (affinity, quota), torch's threads, OMP_/MKL_NUM_THREADS, load
        "memory_gib": round(hw.memory_bytes / 2**30, 1),
        "compute_capability": ".".join(map(str, hw.capability)) if hw.capability else None,
        "precision": {"fp32": True, "bf16": hw.bf16, "fp16": hw.fp16, "tf32": hw.tf32, "fp8": hw.fp8},
        "cudnn": hw.cudnn,
        "compile": _compile_features(hw.device_type),
        "distributed": {
            "available": dist.is_available(),
            "nccl": dist.is_available() and dist.is_nccl_available(),
            "gloo": dist.is_available() and dist.is_gloo_available(),
            "nccl_version": _nccl_version(),
        },
    }
    if gpus:
        topo, why = detect_topology()
        info["interconnect"] = topo.summary() if topo is not None else f"unknown ({why})"
        info["nvlink"] = topo.nvlink if topo is not None else None
    else:
        info["interconnect"] = "no GPU"
        info["nvlink"] = False
    info["infiniband"] = infiniband_devices()
    info["nccl_env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}
    info["nccl_env_problems"] = check_environment(os.environ)
    return info


def _cell(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_cell(v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "-"
    return "-" if value is None else str(value)


def run(args) -> int:
    import json

    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="turbotrain env", show_header=False)
    for key, value in info.items():
        table.add_row(key, "none" if key == "cpu_quota" and value is None else _cell(value))
    Console().print(table)
    return 0
