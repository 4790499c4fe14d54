"""What this machine can do: device, precision support, cores, memory.

Everything the registry's ``requires`` checks and ``Plan.fast()`` rules need is read here
once, so the rest of the code never probes torch or /proc itself.

Cores are the ones this process may really use: its CPU affinity, capped by the cgroup CPU
quota (a container's ``cpu.max``), not the host's count that ``os.cpu_count()`` reports.
Load from other processes is read separately (:func:`other_load`), over a window the caller picks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "Hardware",
    "detect",
    "resolve_device",
    "CGROUP_ROOT",
    "cpu_quota",
    "affinity_cores",
    "usable_cores",
    "other_load",
    "busy_cores",
    "read_cpu_times",
    "load_average",
    "thread_env",
    "cpu_facts",
]

CGROUP_ROOT = "/sys/fs/cgroup"
"""Where the cgroup hierarchies are mounted (tests point :func:`cpu_quota` elsewhere)."""
PROC_SELF_CGROUP = "/proc/self/cgroup"


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
        raise ValueError(
            f"Plan.device: {device!r} was asked for but this machine has no CUDA device "
            f"(torch {torch.__version__}); use device='auto' or 'cpu'."
        )
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


def affinity_cores() -> int:
    """CPUs the scheduler lets this process run on (``os.sched_getaffinity``; the host's count where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _with_ancestors(root: Path, rel: str) -> list[Path]:
    """``root/rel`` and each parent up to ``root``: a quota set on an ancestor cgroup binds too."""
    parts = [p for p in rel.strip("/").split("/") if p and p != ".."]
    return [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _v2_quota(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")  # "max 100000" (no quota) or "50000 100000" (half a core)
    if not text:
        return None
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(directory: Path) -> float | None:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    try:
        q, p = int(quota or "-1"), int(period or "0")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None  # -1: no quota


def cpu_quota(root: str | os.PathLike | None = None, self_cgroup: str | os.PathLike | None = None) -> float | None:
    """This process's cgroup CPU quota in cores (``0.5`` for ``cpu.max`` = "50000 100000"), None without one.

    Reads cgroup v2 (``cpu.max``) and v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``) at the
    process's cgroup paths from ``self_cgroup`` (default /proc/self/cgroup) under ``root``
    (default :data:`CGROUP_ROOT`), and at their ancestors; the smallest quota found binds.
    """
    root = Path(root if root is not None else CGROUP_ROOT)
    text = _read(Path(self_cgroup if self_cgroup is not None else PROC_SELF_CGROUP)) or ""
    places: list[tuple[Path, Any]] = []
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if hier == "0" and controllers == "":
            places += [(d, _v2_quota) for base in (root, root / "unified") for d in _with_ancestors(base, rel)]
        elif "cpu" in controllers.split(","):
            places += [
                (d, _v1_quota)
                for base in dict.fromkeys((root / controllers, root / "cpu", root / "cpu,cpuacct"))
                for d in _with_ancestors(base, rel)
            ]
    if not places:  # no /proc/self/cgroup (or nothing in it): the mount's own root files
        places = [(root, _v2_quota), (root / "cpu", _v1_quota), (root / "cpu,cpuacct", _v1_quota)]
    quotas = [q for q in (read(d) for d, read in places) if q is not None]
    return min(quotas) if quotas else None


def usable_cores(affinity: int | None = None, quota: float | None = None) -> int:
    """Cores this process may really use: its affinity capped by the quota (rounded up), never below 1."""
    cores = affinity if affinity is not None else affinity_cores()
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def thread_env() -> dict[str, str]:
    """The thread-count environment variables that are set (OMP_NUM_THREADS, MKL_NUM_THREADS, ...)."""
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCH_NUM_THREADS")
    return {name: os.environ[name] for name in names if name in os.environ}


def load_average() -> tuple[float, float, float] | None:
    """/proc/loadavg's 1, 5 and 15 minute averages (runnable threads, this process's included)."""
    try:
        one, five, fifteen = os.getloadavg()
        return round(one, 2), round(five, 2), round(fifteen, 2)
    except (OSError, AttributeError):
        return None


def read_cpu_times(text: str | None = None, cpus: "set[int] | None" = None) -> tuple[int, int]:
    """(busy, total) jiffies summed over ``cpus`` (default: all) from /proc/stat's ``cpuN`` lines.

    Busy is everything but idle and iowait (guest time is already inside user time).
    ``text`` replaces reading /proc/stat (tests).
    """
    if text is None:
        text = _read(Path("/proc/stat")) or ""
    busy = total = 0
    for line in text.splitlines():
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit():
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        ticks = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
    return busy, total


def busy_cores(before: tuple[int, int], after: tuple[int, int], cpus: int) -> float:
    """Cores kept busy between two :func:`read_cpu_times` samples taken over ``cpus`` CPUs."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return cpus * busy / total if total > 0 else 0.0


def _child_pids() -> list[str]:
    """This process's workers: its children (from each of its threads' ``children`` list: a few small reads,
    where scanning every process's stat would cost milliseconds on a busy machine) that run this very
    program, as forked DataLoader workers do, or multiprocessing's spawned ones. A child running
    something else (a subprocess.Popen job) is another process's load."""
    pids: list[str] = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return pids
    ours = _read(Path("/proc/self/cmdline"))
    for tid in tasks:
        for pid in (_read(Path(f"/proc/self/task/{tid}/children")) or "").split():
            cmdline = _read(Path(f"/proc/{pid}/cmdline")) or ""
            if cmdline == ours or "multiprocessing" in cmdline:
                pids.append(pid)
    return pids


def _children_cpu_s() -> float:
    """CPU seconds used so far by this process's live children (DataLoader workers, ...)."""
    seconds = 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in _child_pids():
        fields = (_read(Path(f"/proc/{pid}/stat")) or "").rpartition(")")[2].split()
        if len(fields) > 12:  # utime, stime at 11, 12 after the command name
            seconds += (int(fields[11]) + int(fields[12])) / ticks
    return seconds


@dataclass(frozen=True)
class LoadSample:
    """One reading of the machine's CPU time, to difference against a later one (:func:`other_busy_cores`)."""

    at: float  # time.monotonic()
    cpu_times: tuple[int, int]  # (busy, total) jiffies over ``cpus``
    own_s: float  # this process's CPU seconds (and its live children's)
    cpus: int  # how many CPUs ``cpu_times`` covers
    children_s: float = 0.0  # the live children's part of ``own_s`` (0 when they are not counted)


def sample_load(children_are_own: bool = True) -> LoadSample:
    """Read the CPU time of the CPUs this process may run on, and its own (children included by default:
    DataLoader workers are the script's own load)."""
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        cpus = None
    count = len(cpus) if cpus is not None else (os.cpu_count() or 1)
    t = os.times()
    children = _children_cpu_s() if children_are_own else 0.0
    return LoadSample(time.monotonic(), read_cpu_times(cpus=cpus), t.user + t.system + children, count, children)


def children_busy_cores(before: LoadSample | None, after: LoadSample | None) -> float | None:
    """Cores this process's live children (DataLoader workers) kept busy between two samples; None when unknown."""
    if before is None or after is None or after.at <= before.at:
        return None
    return round(max(0.0, after.children_s - before.children_s) / (after.at - before.at), 2)


def other_busy_cores(before: LoadSample | None, after: LoadSample | None) -> float | None:
    """Cores *other* processes kept busy between two samples: /proc/stat's busy time minus this process's
    own (a child that started or ended in between counts approximately). None when unknown."""
    if before is None or after is None or after.cpu_times[1] <= before.cpu_times[1]:
        return None
    own = own_busy_cores(before, after) or 0.0
    return round(max(0.0, busy_cores(before.cpu_times, after.cpu_times, after.cpus) - own), 2)


def own_busy_cores(before: LoadSample | None, after: LoadSample | None) -> float | None:
    """Cores this process (and its counted children) kept busy between two samples; None when unknown."""
    if before is None or after is None or after.at <= before.at:
        return None
    return (after.own_s - before.own_s) / (after.at - before.at)


def other_load(window_s: float = 0.25, children_are_own: bool = True) -> float:
    """Cores that *other* processes kept busy over the next ``window_s`` seconds, on the CPUs this
    process may run on (:func:`other_busy_cores`); 0.0 where /proc is not readable. Blocks for ``window_s``."""
    before = sample_load(children_are_own)
    time.sleep(window_s)
    return other_busy_cores(before, sample_load(children_are_own)) or 0.0


@dataclass(frozen=True)
class Hardware:
    """A snapshot of one device's capabilities (the one training will run on)."""

    device_type: str  # "cpu" or "cuda"
    device_name: str
    device_count: int
    cpu_cores: int  # usable cores: affinity capped by the cgroup quota (see usable_cores)
    memory_bytes: int  # host RAM, or the GPU's memory on CUDA
    capability: tuple[int, int] | None  # CUDA compute capability
    bf16: bool  # bf16 arithmetic is supported *and* fast
    fp16: bool  # fp16 tensor cores (CUDA only)
    tf32: bool  # Ampere or newer
    fp8: bool  # Hopper or newer
    cudnn: bool
    torch_version: str = torch.__version__
    cpu_flags: frozenset[str] = field(default_factory=frozenset, repr=False)
    affinity_cores: int = 0  # CPUs in this process's affinity mask
    cpu_quota: float | None = None  # cgroup CPU quota in cores (None: no quota)
    host_cores: int = 0  # os.cpu_count(): what naive code sizes itself by
    intra_op_threads: int = 0  # torch.get_num_threads() when detect() was called
    interop_threads: int = 0  # torch.get_num_interop_threads()

    @property
    def is_cuda(self) -> bool:
        return self.device_type == "cuda"

    @property
    def usable_cores(self) -> int:
        """The cores this process may really use (affinity and quota); the same number as ``cpu_cores``."""
        return self.cpu_cores

    def cpu_summary(self) -> str:
        """e.g. "2 usable cores (affinity 2, quota none, host 2); torch threads 2 intra-op, 2 inter-op"."""
        quota = "none" if self.cpu_quota is None else f"{self.cpu_quota:g}"
        return (
            f"{self.cpu_cores} usable cores (affinity {self.affinity_cores}, quota {quota}, "
            f"host {self.host_cores}); "
            f"torch threads {self.intra_op_threads} intra-op, {self.interop_threads} inter-op"
        )

    def summary(self) -> str:
        extras = [
            name
            for name, on in (("bf16", self.bf16), ("fp16", self.fp16), ("tf32", self.tf32), ("fp8", self.fp8))
            if on
        ]
        quota = f", quota {self.cpu_quota:g}" if self.cpu_quota is not None else ""
        return (
            f"{self.device_name} ({self.device_type}, {self.cpu_cores} cores{quota}, "
            f"{self.intra_op_threads} torch threads, "
            f"{self.memory_bytes / 2**30:.0f} GiB; fast: {', '.join(extras) or 'fp32 only'})"
        )


@functools.lru_cache(maxsize=None)
def _detect(device_type: str, index: int) -> Hardware:
    flags = _cpu_flags()
    affinity, quota = affinity_cores(), cpu_quota()
    cores = usable_cores(affinity, quota)
    host = os.cpu_count() or affinity
    if device_type == "cuda":
        props = torch.cuda.get_device_properties(index)
        cap = (props.major, props.minor)
        return Hardware(
            device_type="cuda",
            device_name=props.name,
            device_count=torch.cuda.device_count(),
            cpu_cores=cores,
            memory_bytes=props.total_memory,
            capability=cap,
            # Emulated bf16 (before Ampere) runs, slowly: not "fast". torch's check reads the current device, not
            # this one; ROCm's GPUs all have it.
            bf16=bool(torch.version.hip) or cap >= (8, 0),
            fp16=cap >= (7, 0),
            tf32=cap >= (8, 0),
            fp8=cap >= (8, 9),
            cudnn=torch.backends.cudnn.is_available(),
            cpu_flags=flags,
            affinity_cores=affinity,
            cpu_quota=quota,
            host_cores=host,
        )
    # On CPU bf16 autocast only pays off with native bf16 instructions (AVX512-BF16 or AMX).
    bf16 = bool({"avx512_bf16", "amx_bf16"} & flags)
    return Hardware(
        device_type="cpu",
        device_name=_cpu_model(),
        device_count=1,
        cpu_cores=cores,
        memory_bytes=_memory_bytes(),
        capability=None,
        bf16=bf16,
        fp16=False,
        tf32=False,
        fp8=False,
        cudnn=False,
        cpu_flags=flags,
        affinity_cores=affinity,
        cpu_quota=quota,
        host_cores=host,
    )


def detect(device: str | torch.device = "auto") -> Hardware:
    """Capabilities of ``device`` (default: the device ``Plan(device="auto")`` would use).

    The machine is read once per process; torch's thread counts are read at every call.
    """
    dev = resolve_device(device)
    hw = _detect(dev.type, dev.index or 0)
    intra, interop = torch.get_num_threads(), torch.get_num_interop_threads()
    if (hw.intra_op_threads, hw.interop_threads) != (intra, interop):
        hw = dataclasses.replace(hw, intra_op_threads=intra, interop_threads=interop)
    return hw


def cpu_facts(hw: Hardware | None = None, window_s: float = 0.0) -> dict[str, Any]:
    """The CPU facts ``turbotrain env`` and the doctor report: cores (usable, affinity, quota, host),
    torch's thread counts, thread environment variables, load averages, and with ``window_s`` > 0
    the cores other processes kept busy over that window (:func:`other_load`)."""
    hw = hw or detect("cpu")
    facts: dict[str, Any] = {
        "usable_cores": hw.usable_cores,
        "affinity_cores": hw.affinity_cores,
        "cpu_quota": hw.cpu_quota,
        "host_cores": hw.host_cores,
        "intra_op_threads": hw.intra_op_threads,
        "interop_threads": hw.interop_threads,
        "thread_env": thread_env(),
        "load_average": load_average(),
    }
    if window_s > 0:
        facts["other_load"] = other_load(window_s)
    return facts
