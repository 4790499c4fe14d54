"""``turbotrain env``: what this machine can do."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args) -> int:
    import json

    import torch

    from ..hardware import detect

    hw = detect()
    info = {
        "torch": torch.__version__, "device": hw.device_type, "device_name": hw.device_name,
        "device_count": hw.device_count, "cpu_cores": hw.cpu_cores, "memory_gib": round(hw.memory_bytes / 2**30, 1),
        "bf16": hw.bf16, "fp16": hw.fp16, "tf32": hw.tf32, "fp8": hw.fp8, "cudnn": hw.cudnn,
        "compute_capability": ".".join(map(str, hw.capability)) if hw.capability else None,
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="turbotrain env", show_header=False)
    for key, value in info.items():
        table.add_row(key, str(value))
    Console().print(table)
    return 0
