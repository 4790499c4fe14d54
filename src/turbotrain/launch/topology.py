"""How the GPUs of this machine talk to each other: NVLink or PCIe (``nvidia-smi topo -m``), InfiniBand.

DDP's gradient all-reduce and FSDP's all-gathers run over these links, so they decide how
far a multi-GPU job scales: NVLink moves hundreds of GB/s between GPUs, a PCIe path through
the CPU (PHB) or across sockets (SYS) a small fraction of that.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Topology", "parse_topology", "detect_topology", "infiniband_devices", "LINK_MEANING"]

LINK_MEANING = {
    "NV": "NVLink",
    "PIX": "PCIe, through at most one PCIe bridge",
    "PXB": "PCIe, through several PCIe bridges (no host bridge)",
    "PHB": "PCIe, through a CPU's PCIe host bridge",
    "NODE": "PCIe, across host bridges within one NUMA node",
    "SYS": "PCIe, across NUMA nodes (the CPU interconnect, e.g. QPI/UPI)",
}
# From fastest to slowest, for the summary's "worst link".
_ORDER = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Topology:
    gpus: list[str]
    links: dict[tuple[str, str], str] = field(default_factory=dict)  # (GPU0, GPU1) -> "NV12" / "PHB" / ...
    nics: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0

    def kinds(self) -> set[str]:
        return {("NV" if link.startswith("NV") else link) for link in self.links.values()}

    @property
    def nvlink(self) -> bool:
        return "NV" in self.kinds()

    def summary(self) -> str:
        if len(self.gpus) < 2:
            return "one GPU (no GPU-to-GPU links)"
        kinds = [k for k in _ORDER if k in self.kinds()]
        if not kinds:
            return "unknown"
        if kinds == ["NV"]:
            widths = sorted({link for link in self.links.values() if link.startswith("NV")})
            return f"NVLink between every pair of GPUs ({', '.join(widths)})"
        worst = kinds[-1]
        if "NV" in kinds:
            return f"NVLink between some GPUs; slowest pair: {worst} ({LINK_MEANING[worst]})"
        return f"PCIe only; slowest pair: {worst} ({LINK_MEANING[worst]})"


def parse_topology(text: str) -> Topology:
    """Parse the matrix ``nvidia-smi topo -m`` prints (GPU rows and columns, NIC columns, legend)."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header_index = next((i for i, line in enumerate(lines) if re.search(r"\bGPU0\b", line)), None)
    if header_index is None:
        return Topology(gpus=[])
    columns = [c for c in re.split(r"\s+", lines[header_index].strip()) if re.fullmatch(r"(GPU|NIC)\d+", c)]
    topo = Topology(gpus=[c for c in columns if c.startswith("GPU")])
    for line in lines[header_index + 1 :]:
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue  # NIC rows, the legend, blank lines
        row = cells[0]
        for column, cell in zip(columns, cells[1:]):
            if column.startswith("GPU") and column != row and cell != "X":
                topo.links[(row, column)] = cell
    for line in lines:
        match = re.match(r"^\s*(NIC\d+):\s*(\S+)\s*$", line)
        if match:
            topo.nics[match.group(1)] = match.group(2)
    return topo


def detect_topology(timeout_s: float = 10.0) -> tuple[Topology | None, str | None]:
    """The topology from ``nvidia-smi topo -m``, or (None, why not)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "nvidia-smi not found"
    try:
        proc = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi topo -m failed: {exc}"
    if proc.returncode != 0:
        return None, f"nvidia-smi topo -m exited {proc.returncode}: {proc.stderr.strip()[:200]}"
    return parse_topology(proc.stdout), None


def infiniband_devices(root: str = "/sys/class/infiniband") -> list[str]:
    """InfiniBand / RoCE adapters the kernel knows (NCCL uses them between nodes unless NCCL_IB_DISABLE=1)."""
    path = Path(root)
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else []
