"""`nccl-env`: a mistyped NCCL variable (`NCCL_BUFF_SIZE`: NCCL reads `NCCL_BUFFSIZE`), a transport switched off, debug
logging.

Reads: environment, source.
Applies to: a GPU.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Literal

from ...analysis.source import dotted_name
from ...findings import Evidence, Finding, Fix, speedup_for_rule
from ..common import sources, static_finding
from ..rule import Detect, Rule, register

if TYPE_CHECKING:
    from ...analysis.context import Context


# Documented in NCCL's "Environment Variables" guide (2.x) plus PyTorch's own TORCH_NCCL_* names.
KNOWN = frozenset(
    """
NCCL_DEBUG NCCL_DEBUG_FILE NCCL_DEBUG_SUBSYS NCCL_DEBUG_TIMESTAMP_FORMAT NCCL_DEBUG_TIMESTAMP_LEVELS
NCCL_SOCKET_IFNAME NCCL_SOCKET_FAMILY NCCL_SOCKET_NTHREADS NCCL_NSOCKS_PERTHREAD NCCL_SOCKET_RETRY_CNT
NCCL_SOCKET_RETRY_SLEEP_MSEC NCCL_CROSS_NIC NCCL_IB_HCA NCCL_IB_TIMEOUT NCCL_IB_RETRY_CNT NCCL_IB_GID_INDEX
NCCL_IB_ADDR_FAMILY NCCL_IB_ADDR_RANGE NCCL_IB_ROCE_VERSION_NUM NCCL_IB_SL NCCL_IB_TC NCCL_IB_FIFO_TC
NCCL_IB_RETURN_ASYNC_EVENTS NCCL_IB_DISABLE NCCL_IB_AR_THRESHOLD NCCL_IB_QPS_PER_CONNECTION
NCCL_IB_SPLIT_DATA_ON_QPS NCCL_IB_CUDA_SUPPORT NCCL_IB_PCI_RELAXED_ORDERING NCCL_IB_ADAPTIVE_ROUTING
NCCL_IB_ECE_ENABLE NCCL_IB_MERGE_NICS NCCL_IB_MERGE_VFS NCCL_IB_USE_INLINE NCCL_IB_PKEY NCCL_IB_MQP_RETRY_ALL
NCCL_IB_MQP_RETRY_CNT NCCL_IB_MQP_RETRY_SLEEP_MSEC NCCL_IB_ROUTABLE_FLID_GID_INDEX NCCL_IB_OOO_RQ
NCCL_OOB_NET_ENABLE NCCL_OOB_NET_IFNAME NCCL_UID_STAGGER_THRESHOLD NCCL_UID_STAGGER_RATE NCCL_NET NCCL_NET_PLUGIN
NCCL_TUNER_PLUGIN NCCL_PROFILER_PLUGIN NCCL_ENV_PLUGIN NCCL_IGNORE_CPU_AFFINITY NCCL_CONF_FILE NCCL_HOSTID
NCCL_TOPO_FILE NCCL_TOPO_DUMP_FILE NCCL_SET_THREAD_NAME NCCL_P2P_DISABLE NCCL_P2P_LEVEL NCCL_P2P_DIRECT_DISABLE
NCCL_P2P_NET_CHUNKSIZE NCCL_P2P_PCI_CHUNKSIZE NCCL_P2P_NVL_CHUNKSIZE NCCL_P2P_USE_CUDA_MEMCPY
NCCL_P2P_LL_THRESHOLD NCCL_P2P_READ_ENABLE NCCL_SHM_DISABLE NCCL_SHM_USE_CUDA_MEMCPY NCCL_SHM_MEMCPY_MODE
NCCL_SHM_LOCALITY NCCL_BUFFSIZE NCCL_LL_BUFFSIZE NCCL_LL128_BUFFSIZE NCCL_NTHREADS NCCL_LL128_NTHREADS
NCCL_MAX_NCHANNELS NCCL_MIN_NCHANNELS NCCL_MAX_NRINGS NCCL_MIN_NRINGS NCCL_CHECKS_DISABLE
NCCL_CHECK_POINTERS NCCL_LAUNCH_MODE NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_NET_GDR_C2C NCCL_NET_SHARED_BUFFERS
NCCL_NET_SHARED_COMMS NCCL_NET_FORCE_FLUSH NCCL_NET_OVERHEAD NCCL_NET_DISABLE_INTRA NCCL_SINGLE_RING_THRESHOLD
NCCL_LL_THRESHOLD NCCL_TREE_THRESHOLD NCCL_ALGO NCCL_PROTO NCCL_IGNORE_DISABLED_P2P NCCL_NVB_DISABLE
NCCL_NVB_PRECONNECT NCCL_PXN_DISABLE NCCL_P2P_PXN_LEVEL NCCL_PXN_C2C NCCL_RUNTIME_CONNECT NCCL_GRAPH_REGISTER
NCCL_LOCAL_REGISTER NCCL_LEGACY_CUDA_REGISTER NCCL_SET_STACK_SIZE NCCL_GRAPH_MIXING_SUPPORT NCCL_DMABUF_ENABLE
NCCL_CUMEM_ENABLE NCCL_CUMEM_HOST_ENABLE NCCL_MNNVL_ENABLE NCCL_MNNVL_UUID NCCL_MNNVL_CLIQUE_ID NCCL_CTA_POLICY
NCCL_NVLS_ENABLE NCCL_NVLS_NCHANNELS NCCL_NVLS_CHUNKSIZE NCCL_NVLSTREE_MAX_CHUNKSIZE NCCL_COLLNET_ENABLE
NCCL_COLLNET_NODE_THRESHOLD NCCL_WORK_FIFO_DEPTH NCCL_WORK_FIFO_BYTES NCCL_NCHANNELS_PER_NET_PEER
NCCL_NCHANNELS_PER_PEER NCCL_MAX_CTAS NCCL_MIN_CTAS NCCL_COMM_BLOCKING NCCL_COMM_ID NCCL_GDRCOPY_ENABLE
NCCL_GDRCOPY_SYNC_ENABLE NCCL_GDRCOPY_FLUSH_ENABLE NCCL_GDRCOPY_FIFO_ENABLE NCCL_RAS_ENABLE NCCL_RAS_ADDR
NCCL_RAS_TIMEOUT_FACTOR NCCL_CONNECT_TIMEOUT NCCL_PROXY_APPEND_BATCH_SIZE NCCL_PROGRESS_APPENDOP_FREQ
NCCL_CREATE_THREAD_CONTEXT NCCL_NVTX_DISABLE NCCL_WIN_ENABLE NCCL_SYM_KERNEL NCCL_ALLOC_P2P_NET_LL_BUFFERS
NCCL_ASYNC_ERROR_HANDLING NCCL_BLOCKING_WAIT NCCL_DESYNC_DEBUG NCCL_ENABLE_TIMING NCCL_ENABLE_MONITORING
NCCL_HEARTBEAT_TIMEOUT_SEC NCCL_TRACE_BUFFER_SIZE NCCL_DUMP_ON_TIMEOUT NCCL_AVOID_RECORD_STREAMS
""".split()
)


# Not a setting: NVIDIA's CUDA container images label the NCCL they ship with it (nothing reads it).
IMAGE_LABELS = frozenset({"NCCL_VERSION"})


# Settings that turn a fast transport off: right while debugging, slow when forgotten.
DISABLERS = {
    "NCCL_P2P_DISABLE": "direct GPU-to-GPU copies over NVLink/PCIe",
    "NCCL_IB_DISABLE": "InfiniBand/RoCE between nodes (falls back to TCP sockets)",
    "NCCL_SHM_DISABLE": "shared-memory transfers between GPUs of one node",
    "NCCL_NVLS_ENABLE": None,  # 0 turns NVLink SHARP off; only flagged when set to 0 below
}


# PyTorch renamed its own NCCL switches; the old names still work but warn and will go.
RENAMED = {
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
}


NcclProblem = Literal["typo", "unknown", "disabled", "debug", "renamed"]


@dataclass(frozen=True)
class NcclEvidence(Evidence):
    variable: str
    kind: NcclProblem


def check_nccl_env(env: dict[str, str]) -> list[tuple[str, NcclProblem, str, str]]:
    """Problems as ``(variable, kind, message, fix)``."""
    problems: list[tuple[str, NcclProblem, str, str]] = []
    for name in sorted(env):
        if not name.startswith("NCCL_") or name in IMAGE_LABELS:
            continue
        value = env[name]
        if name not in KNOWN:
            close = difflib.get_close_matches(name, KNOWN, n=1, cutoff=0.85)
            if close:
                problems.append(
                    (
                        name,
                        "typo",
                        f"{name} is not an NCCL variable, so NCCL ignores it; {close[0]} is.",
                        f"rename it: export {close[0]}={value}",
                    )
                )
            else:
                problems.append(
                    (
                        name,
                        "unknown",
                        f"{name} is not a variable NCCL documents; NCCL ignores it.",
                        "check the name against NCCL's environment variable guide",
                    )
                )
        elif name in RENAMED:
            problems.append(
                (
                    name,
                    "renamed",
                    f"{name} is PyTorch's old name; it now reads {RENAMED[name]}.",
                    f"export {RENAMED[name]}={value}",
                )
            )
        elif name in DISABLERS and DISABLERS[name] and value.strip() not in ("", "0"):
            problems.append(
                (
                    name,
                    "disabled",
                    f"{name}={value} turns off {DISABLERS[name]}.",
                    f"unset {name} unless it works around a known fault",
                )
            )
        elif name == "NCCL_NVLS_ENABLE" and value.strip() == "0":
            problems.append(
                (
                    name,
                    "disabled",
                    "NCCL_NVLS_ENABLE=0 turns off NVLink SHARP collectives.",
                    "unset NCCL_NVLS_ENABLE unless it works around a known fault",
                )
            )
        elif name == "NCCL_DEBUG" and value.strip().upper() in ("INFO", "TRACE"):
            problems.append(
                (
                    name,
                    "debug",
                    f"NCCL_DEBUG={value} logs every communicator set-up (TRACE: every call).",
                    "NCCL_DEBUG=WARN outside debugging",
                )
            )
    return problems


def nccl_env(ctx: Context) -> Iterator[Finding]:
    for name, kind, message, fix in check_nccl_env(ctx.env):
        f = Finding(
            "nccl-env",
            where=f"env {name}",
            message=message,
            fix=Fix(fix),
            category="compute",
            speedup=speedup_for_rule("nccl-env"),
            evidence=NcclEvidence(variable=name, kind=kind),
        )
        f.provisional("medium" if kind in ("typo", "disabled") and (ctx.on_gpu or ctx.world_size > 1) else "low")
        if f.severity == "low" and kind in ("typo", "disabled"):
            f.note = "This run does not use NCCL (no GPU or process group); it matters on multi-GPU runs."
        yield f


def nccl_env_static(ctx: Context) -> Iterator[Finding]:
    for index in sources(ctx):
        for node in ast.walk(index.tree):
            name = None
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
                target = node.targets[0]
                if dotted_name(target.value).endswith("environ") and isinstance(target.slice, ast.Constant):
                    name = target.slice.value
            elif isinstance(node, ast.Call) and dotted_name(node.func).endswith(("environ.setdefault", "putenv")):
                if node.args and isinstance(node.args[0], ast.Constant):
                    name = node.args[0].value
            if not isinstance(name, str) or not name.startswith("NCCL_"):
                continue
            for _var, kind, message, fix in check_nccl_env({name: "1"}):
                if kind in ("typo", "unknown", "renamed"):
                    f = static_finding("nccl-env", index, node, message, Fix(fix), speedup=speedup_for_rule("nccl-env"))
                    if kind == "typo" and (ctx.on_gpu or ctx.world_size > 1):
                        f.provisional("medium")
                    yield f


RULE = register(
    Rule(
        "nccl-env",
        detect=(
            Detect("live", nccl_env),
            Detect("static", nccl_env_static),
        ),
    )
)
