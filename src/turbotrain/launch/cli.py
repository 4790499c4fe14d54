"""``turbotrain launch``: run a training script on torchrun (torch.distributed.elastic).

    turbotrain launch --nproc-per-node 4 train.py --lr 3e-4
    turbotrain launch --nnodes 2 --node-rank 0 --rdzv-endpoint 10.0.0.1:29400 --nproc-per-node 8 train.py
    turbotrain launch --nproc-per-node 2 --max-restarts 3 train.py      # elastic: restart the group on failure

This is torchrun, not a launcher of our own: the options are translated to torchrun's
(:func:`torchrun_argv`) and handed to ``torch.distributed.run`` in this process, which
becomes the elastic agent. What turbotrain adds: one-node runs need no rendezvous options
(``--standalone``) and listen on the loopback only (:func:`loopback_only`), ``--node-rank 0``
names the node that hosts the c10d rendezvous store, and NCCL settings are validated and
passed to every worker's environment.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator

from ..config import ConfigError
from .nccl import NcclSettings, check_environment, parse_size

log = logging.getLogger("turbotrain")

__all__ = ["add_arguments", "run", "LaunchOptions", "torchrun_argv", "launch", "loopback_only"]

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class LaunchOptions:
    script: str
    script_args: tuple[str, ...] = ()
    nproc_per_node: str = "1"
    nnodes: str = "1"
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "c10d"
    rdzv_id: str = "turbotrain"
    local_addr: str | None = None
    max_restarts: int = 0
    monitor_interval: float | None = None
    module: bool = False

    @property
    def max_nodes(self) -> int:
        return int(self.nnodes.split(":")[-1])

    @property
    def one_node(self) -> bool:
        """A job on this machine alone: nothing outside it needs to reach its rendezvous or its ranks."""
        return self.max_nodes == 1 and self.rdzv_endpoint is None


def _check(opts: LaunchOptions) -> None:
    nproc = opts.nproc_per_node
    if not (nproc in ("auto", "gpu", "cpu") or (nproc.isdigit() and int(nproc) >= 1)):
        raise ConfigError(f"launch --nproc-per-node {nproc!r}: give a number >= 1, or auto / gpu / cpu.")
    parts = opts.nnodes.split(":")
    if not (
        1 <= len(parts) <= 2 and all(p.isdigit() and int(p) >= 1 for p in parts) and int(parts[0]) <= int(parts[-1])
    ):
        raise ConfigError(f"launch --nnodes {opts.nnodes!r}: give a number of nodes (2) or a range MIN:MAX (1:4).")
    if opts.max_restarts < 0:
        raise ConfigError(f"launch --max-restarts {opts.max_restarts}: must be >= 0.")
    if opts.rdzv_endpoint is not None:
        host, sep, port = opts.rdzv_endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"launch --rdzv-endpoint {opts.rdzv_endpoint!r}: expected host:port, e.g. "
                "10.0.0.1:29400 (the address of the node with --node-rank 0)."
            )
    if opts.max_nodes > 1 and opts.rdzv_endpoint is None:
        raise ConfigError(
            f"launch --nnodes {opts.nnodes}: several nodes meet at a rendezvous; give "
            "--rdzv-endpoint HOST:PORT with the address of node 0, the same on every node."
        )
    if opts.node_rank is not None and not 0 <= opts.node_rank < opts.max_nodes:
        raise ConfigError(
            f"launch --node-rank {opts.node_rank}: must be in 0..{opts.max_nodes - 1} for --nnodes {opts.nnodes}."
        )
    if opts.rdzv_backend == "static" and opts.max_nodes > 1 and opts.node_rank is None:
        raise ConfigError("launch --rdzv-backend static: every node needs its --node-rank (0 on the master).")
    if not opts.module and not os.path.exists(opts.script):
        raise ConfigError(
            f"launch: training script {opts.script!r} does not exist (use -m to run a module instead of a file)."
        )


def torchrun_argv(opts: LaunchOptions) -> list[str]:
    """The torchrun command line (without the program name) that ``opts`` mean."""
    _check(opts)
    argv = ["--nproc-per-node", opts.nproc_per_node]
    if opts.one_node:
        # One node: a private rendezvous on a free local port, nothing to configure.
        argv += ["--standalone", "--nnodes", opts.nnodes]
    else:
        argv += [
            "--nnodes",
            opts.nnodes,
            "--rdzv-backend",
            opts.rdzv_backend,
            "--rdzv-endpoint",
            opts.rdzv_endpoint or "",
            "--rdzv-id",
            opts.rdzv_id,
        ]
        if opts.rdzv_backend == "static":
            argv += ["--node-rank", str(opts.node_rank or 0)]
        elif opts.node_rank is not None:
            # The c10d rendezvous assigns node ranks itself; what a node rank can still say is which node
            # hosts the rendezvous store (torchrun otherwise guesses from host names, which fails when
            # nodes share a host name or the endpoint is an address the host name does not resolve to).
            argv += ["--rdzv-conf", f"is_host={'true' if opts.node_rank == 0 else 'false'}"]
    # One node: the ranks meet the store at the loopback (MASTER_ADDR), which is all the store listens on (launch).
    local_addr = opts.local_addr or (LOOPBACK if opts.one_node else None)
    if local_addr:
        argv += ["--local-addr", local_addr]
    argv += ["--max-restarts", str(opts.max_restarts)]
    if opts.monitor_interval is not None:
        argv += ["--monitor-interval", str(opts.monitor_interval)]
    if opts.module:
        argv.append("--module")
    return argv + [opts.script, *opts.script_args]


def launch(opts: LaunchOptions, nccl: NcclSettings | None = None) -> int:
    """Run ``opts.script`` on torchrun in this process; the workers' exit decides the return code."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import run as torchrun

    argv = torchrun_argv(opts)
    nccl = nccl or NcclSettings()
    for problem in check_environment({k: v for k, v in os.environ.items() if k not in nccl.to_env()}):
        log.warning("turbotrain launch: %s", problem)
    for key, value in nccl.to_env().items():
        if key in os.environ and os.environ[key] != value:
            log.warning("turbotrain launch: %s=%s from the environment replaced by %s", key, os.environ[key], value)
        os.environ[key] = value  # torchrun's workers inherit this process's environment
    if opts.max_restarts > 0:
        # torch 2.13's c10d rendezvous hands every attempt the same TCPStore, so a restarted worker can read
        # the killed attempt's addresses (gloo/NCCL connect to a dead port; pytorch/pytorch#135712). With this
        # opt-out, rank 0 of each attempt starts a fresh store.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    loopback = opts.one_node and opts.local_addr is None
    if loopback and sys.platform.startswith("linux") and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # the ranks' gloo sockets on the loopback too, not the host's address
    log.info("turbotrain launch: torchrun %s", shlex.join(argv))
    # torchrun's parser would read the script's own options too (``--log`` is an ambiguous prefix of its
    # ``--log-dir`` ...): it parses up to the script's name, and the script's arguments are set untouched.
    n_script_args = len(opts.script_args)
    args = get_args_parser().parse_args(argv[: len(argv) - n_script_args])
    args.training_script_args = list(opts.script_args)
    with _log_dir(args):
        try:
            with loopback_only() if loopback else contextlib.nullcontext():
                torchrun(args)
        except ChildFailedError as exc:
            print(exc.format_msg(), file=sys.stderr)
            return 1
    return 0


@contextlib.contextmanager
def _log_dir(args: Any) -> Iterator[None]:
    """Where none is given (``--log-dir``, ``PET_LOG_DIR``), torchrun makes a ``torchelastic_*`` folder in the
    temporary directory per launch and leaves it: one is made here instead, and removed after the run unless a
    rank wrote a file there (an error record a failure message points at)."""
    if args.log_dir is not None:
        yield
        return
    args.log_dir = tempfile.mkdtemp(prefix="torchelastic_")
    try:
        yield
    finally:
        if not any(files for _, _, files in os.walk(args.log_dir)):
            shutil.rmtree(args.log_dir, ignore_errors=True)


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """While inside, the TCP stores this process hosts (torchrun's rendezvous store, and the store the ranks meet
    at) listen on 127.0.0.1 only. torch 2.13's ``TCPStore`` binds every interface and has no option for an
    address, but takes a socket it is given (``master_listen_fd``): one bound to the loopback is made here."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    class LoopbackTCPStore(dist.TCPStore):
        def __init__(
            self,
            host_name: str,
            port: int,
            world_size: int | None = None,
            is_master: bool = False,
            timeout: timedelta = timedelta(seconds=300),
            wait_for_workers: bool = True,
            multi_tenant: bool = False,
            master_listen_fd: int | None = None,
            use_libuv: bool = True,
        ) -> None:
            if is_master and master_listen_fd is None:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    listener.bind((LOOPBACK, port))
                    listener.listen(socket.SOMAXCONN)
                except OSError as exc:
                    listener.close()
                    raise RuntimeError(f"turbotrain launch: cannot listen on {LOOPBACK}:{port}: {exc}") from exc
                port = listener.getsockname()[1]
                master_listen_fd = listener.detach()  # the store owns the socket from here
            super().__init__(
                host_name,
                port,
                world_size=world_size,
                is_master=is_master,
                timeout=timeout,
                wait_for_workers=wait_for_workers,
                multi_tenant=multi_tenant,
                master_listen_fd=master_listen_fd,
                use_libuv=use_libuv,
            )

    # torchrun's modules look the class up in torch.distributed when they run; the c10d backend imported it by name.
    modules = (dist, c10d_rendezvous_backend)
    saved = [module.TCPStore for module in modules]
    for module in modules:
        setattr(module, "TCPStore", LoopbackTCPStore)  # noqa: B010 - mypy refuses to assign to a module's class
    try:
        yield
    finally:
        for module, original in zip(modules, saved):
            setattr(module, "TCPStore", original)  # noqa: B010 - as above


# -- the command line ------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # No prefix matching: a script option such as ``--n 5`` after the script's name is the script's, never an
    # ambiguous abbreviation of ``--nnodes`` / ``--nproc-per-node`` (everything after SCRIPT is passed untouched).
    parser.allow_abbrev = False
    parser.add_argument(
        "--nproc-per-node", default="1", help="processes on this node: a number, or auto/gpu/cpu (default 1)"
    )
    parser.add_argument("--nnodes", default="1", help="number of nodes, or MIN:MAX for an elastic range (default 1)")
    parser.add_argument(
        "--node-rank",
        type=int,
        default=None,
        help="this node's rank; node 0 hosts the rendezvous (with --rdzv-backend static: the global node rank)",
    )
    parser.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of node 0's rendezvous (several nodes)")
    parser.add_argument(
        "--rdzv-backend",
        choices=("c10d", "static"),
        default="c10d",
        help="c10d (default: nodes may join and restart) or static (fixed node ranks)",
    )
    parser.add_argument("--rdzv-id", default="turbotrain", help="job id, the same on every node (default turbotrain)")
    parser.add_argument("--local-addr", default=None, help="the address other nodes reach this node at")
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="restart the worker group this many times after a failure (resume from the last "
        "checkpoint with fit(resume=True))",
    )
    parser.add_argument("--monitor-interval", type=float, default=None, help="seconds between worker health checks")
    parser.add_argument("-m", "--module", action="store_true", help="run SCRIPT as a module (python -m)")
    nccl = parser.add_argument_group("NCCL (GPU communication) settings, passed to every worker")
    nccl.add_argument(
        "--nccl-algo",
        default=None,
        help="NCCL_ALGO: Ring, Tree, CollnetDirect, CollnetChain, NVLS, NVLSTree, PAT (comma list; ^ excludes)",
    )
    nccl.add_argument("--nccl-proto", default=None, help="NCCL_PROTO: LL, LL128, Simple")
    nccl.add_argument("--nccl-buffsize", default=None, help="NCCL_BUFFSIZE: bytes, or 4M / 16MiB (NCCL default 4M)")
    nccl.add_argument("--nccl-socket-ifname", default=None, help="NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME)")
    nccl.add_argument("--nccl-ib-disable", action="store_true", default=None, help="NCCL_IB_DISABLE=1")
    nccl.add_argument("--nccl-debug", default=None, choices=("VERSION", "WARN", "INFO", "TRACE"), help="NCCL_DEBUG")
    nccl.add_argument(
        "--nccl-env",
        action="append",
        default=[],
        metavar="NCCL_NAME=VALUE",
        help="any other NCCL variable (repeatable)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the torchrun command and environment, run nothing"
    )
    # One REMAINDER for the script and its arguments: argparse hands it over untouched (a separate
    # ``script`` positional would make it drop the first ``--`` of the script's own arguments).
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="SCRIPT [ARGS ...]",
        help="training script (or module with -m), then its own arguments, passed untouched",
    )


def split_command(command: list[str]) -> tuple[str, tuple[str, ...]]:
    """(script, its arguments) from what follows launch's options; a leading ``--`` only ends those options."""
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ConfigError("launch: name the training script to run (turbotrain launch [options] SCRIPT [ARGS ...]).")
    return command[0], tuple(command[1:])


def options_from_args(args) -> tuple[LaunchOptions, NcclSettings]:
    script, script_args = split_command(args.command)
    opts = LaunchOptions(
        script=script,
        script_args=script_args,
        nproc_per_node=str(args.nproc_per_node),
        nnodes=str(args.nnodes),
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_backend=args.rdzv_backend,
        rdzv_id=args.rdzv_id,
        local_addr=args.local_addr,
        max_restarts=args.max_restarts,
        monitor_interval=args.monitor_interval,
        module=args.module,
    )
    nccl = NcclSettings(
        algo=args.nccl_algo,
        proto=args.nccl_proto,
        buffsize=None if args.nccl_buffsize is None else parse_size(args.nccl_buffsize),
        socket_ifname=args.nccl_socket_ifname,
        ib_disable=args.nccl_ib_disable,
        debug=args.nccl_debug,
        extra=tuple(args.nccl_env),
    )
    return opts, nccl


def run(args) -> int:
    opts, nccl = options_from_args(args)
    if args.dry_run:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in nccl.to_env().items())
        print(f"{env + ' ' if env else ''}torchrun {shlex.join(torchrun_argv(opts))}")
        return 0
    return launch(opts, nccl)
