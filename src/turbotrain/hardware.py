"""What this machine can do: device, precision support, cores, memory.

Everything the registry's ``requires`` checks and ``Plan.fast()`` rules need is read here
once, so the rest of the code never probes torch or /proc itself.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, field

import torch

__all__ = ["Hardware", "detect", "resolve_device"]


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> the first CUDA device when present, else the CPU; anything else as given."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        if torch.cuda.is_available():
            local_rank = int(os.environ.get("LOCAL_RANK", 0))
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"Plan.device: {device!r} is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'.") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"Plan.device: {device!r} was asked for but this machine has no CUDA device "
                         f"(torch {torch.__version__}); use device='auto' or 'cpu'.")
    return dev


def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def read_proc_kib(path: str, key: str) -> int | None:
    """A ``Key:  123 kB`` field of a /proc file (self/status, meminfo) in KiB; None where there is none."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Hardware:
    """A snapshot of one device's capabilities (the one training will run on)."""

    device_type: str                      # "cpu" or "cuda"
    device_name: str
    device_count: int
    cpu_cores: int
    memory_bytes: int                     # host RAM, or the GPU's memory on CUDA
    capability: tuple[int, int] | None    # CUDA compute capability
    bf16: bool                            # bf16 arithmetic is supported *and* fast
    fp16: bool                            # fp16 tensor cores (CUDA only)
    tf32: bool                            # Ampere or newer
    fp8: bool                             # Hopper or newer
    cudnn: bool
    torch_version: str = torch.__version__
    cpu_flags: frozenset[str] = field(default_factory=frozenset, repr=False)

    @property
    def is_cuda(self) -> bool:
        return self.device_type == "cuda"

    def summary(self) -> str:
        extras = [name for name, on in (("bf16", self.bf16), ("fp16", self.fp16), ("tf32", self.tf32),
                                        ("fp8", self.fp8)) if on]
        return (f"{self.device_name} ({self.device_type}, {self.cpu_cores} cores, "
                f"{self.memory_bytes / 2**30:.0f} GiB; fast: {', '.join(extras) or 'fp32 only'})")


@functools.lru_cache(maxsize=None)
def _detect(device_type: str, index: int) -> Hardware:
    flags = _cpu_flags()
    cores = _usable_cores()
    if device_type == "cuda":
        props = torch.cuda.get_device_properties(index)
        cap = (props.major, props.minor)
        return Hardware(
            device_type="cuda", device_name=props.name, device_count=torch.cuda.device_count(),
            cpu_cores=cores, memory_bytes=props.total_memory, capability=cap,
            bf16=torch.cuda.is_bf16_supported(), fp16=cap >= (7, 0), tf32=cap >= (8, 0),
            fp8=cap >= (8, 9), cudnn=torch.backends.cudnn.is_available(), cpu_flags=flags,
        )
    # On CPU bf16 autocast only pays off with native bf16 instructions (AVX512-BF16 or AMX).
    bf16 = bool({"avx512_bf16", "amx_bf16"} & flags)
    return Hardware(
        device_type="cpu", device_name=_cpu_model(), device_count=1,
        cpu_cores=cores, memory_bytes=_memory_bytes(), capability=None, bf16=bf16, fp16=False,
        tf32=False, fp8=False, cudnn=False, cpu_flags=flags,
    )


def detect(device: str | torch.device = "auto") -> Hardware:
    """Capabilities of ``device`` (default: the device ``Plan(device="auto")`` would use)."""
    dev = resolve_device(device)
    return _detect(dev.type, dev.index or 0)
