"""`turbotrain env`: the interconnect parser on real `nvidia-smi topo -m` layouts, and the report itself."""

from __future__ import annotations

import json
import subprocess
import sys

from launch_helpers import ROOT, cli_env
from turbotrain.launch.topology import parse_topology

# An 8-GPU HGX board: every pair on NVLink, NICs across the CPU interconnect.
HGX = """\
\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m
GPU0\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tPXB\t0-55\t0\t\tN/A
GPU1\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tSYS\t0-55\t0\t\tN/A
GPU2\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tSYS\t0-55\t0\t\tN/A
GPU3\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tSYS\t0-55\t0\t\tN/A
GPU4\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tSYS\t56-111\t1\t\tN/A
GPU5\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tSYS\t56-111\t1\t\tN/A
GPU6\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tSYS\t56-111\t1\t\tN/A
GPU7\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tSYS\t56-111\t1\t\tN/A
NIC0\tPXB\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\tSYS\t X \t\t\t\t

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
"""

# A workstation: two PCIe GPUs on different sockets.
WORKSTATION = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tSYS\t0-15\t0\t\tN/A
GPU1\tSYS\t X \t16-31\t1\t\tN/A

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
"""


def test_nvlink_board_is_recognised():
    topo = parse_topology(HGX)
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    assert len(topo.links) == 8 * 7 and topo.links[("GPU3", "GPU6")] == "NV18"
    assert topo.nvlink and topo.nics == {"NIC0": "mlx5_0"}
    assert topo.summary() == "NVLink between every pair of GPUs (NV18)"


def test_pcie_workstation_names_the_slow_path():
    topo = parse_topology(WORKSTATION)
    assert topo.links == {("GPU0", "GPU1"): "SYS", ("GPU1", "GPU0"): "SYS"}
    assert not topo.nvlink
    assert topo.summary().startswith("PCIe only; slowest pair: SYS (PCIe, across NUMA nodes")


def test_mixed_links_report_the_slowest_pair():
    text = WORKSTATION.replace("GPU0\t X \tSYS", "GPU0\t X \tNV4")
    assert parse_topology(text).summary().startswith("NVLink between some GPUs; slowest pair: SYS")


def test_single_gpu_and_garbage():
    assert parse_topology("\tGPU0\tCPU Affinity\nGPU0\t X \t0-7\n").summary() == "one GPU (no GPU-to-GPU links)"
    assert parse_topology("NVIDIA-SMI has failed").gpus == []


def test_env_json_reports_devices_precision_compile_and_nccl():
    proc = subprocess.run([sys.executable, "-m", "turbotrain", "env", "--json"], cwd=ROOT,
                          env=cli_env(NCCL_DEBUG="TRACE"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    import torch

    assert info["gpu_count"] == torch.cuda.device_count()
    assert set(info["precision"]) == {"fp32", "bf16", "fp16", "tf32", "fp8"}
    assert info["compile"]["available"] is True and isinstance(info["compile"]["modes"], list)
    assert info["distributed"]["gloo"] is True
    assert info["nccl_env"] == {"NCCL_DEBUG": "TRACE"} and "slows training" in info["nccl_env_problems"][0]
    if not torch.cuda.is_available():
        assert info["interconnect"] == "no GPU" and info["distributed"]["nccl_version"] is None
