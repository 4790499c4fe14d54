"""NCCL settings passed through ``turbotrain launch`` as environment variables, validated first.

NCCL reads its tuning knobs from ``NCCL_*`` environment variables when the process group
starts. A typo there is silent (NCCL ignores an unknown algorithm name, or fails deep in
the first collective), so the values are checked here, before any worker starts:

* ``NCCL_ALGO``: the collective algorithm(s): Ring, Tree, CollnetDirect, CollnetChain, NVLS,
  NVLSTree, PAT; a comma list, ``^`` to exclude, or per-collective ``allreduce:tree;...``.
* ``NCCL_PROTO``: LL, LL128, Simple (same list syntax).
* ``NCCL_BUFFSIZE``: bytes of the buffer between each pair of ranks (NCCL's default 4 MiB);
  larger buffers can help large all-reduces over slow links.
* ``NCCL_SOCKET_IFNAME`` / ``NCCL_IB_DISABLE`` / ``NCCL_DEBUG`` for the network side.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Literal, Mapping

from ..config import ConfigError, strict
from ..config import parse_size as config_size

__all__ = ["NcclSettings", "parse_size", "check_environment", "ALGORITHMS", "PROTOCOLS"]

log = logging.getLogger("turbotrain")

ALGORITHMS = ("Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")
PROTOCOLS = ("LL", "LL128", "Simple")
_COLLECTIVES = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "sendrecv", "alltoall")
_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")


def parse_size(text: str | int) -> int:
    """Bytes from ``4194304``, ``4M``, ``4MiB`` or ``512k`` (binary units, as NCCL's docs use)."""
    return config_size(text, "NCCL buffer size")


def _check_choice_list(name: str, value: str, choices: tuple[str, ...]) -> str:
    """Validate NCCL's list syntax: ``A,B``, ``^A`` (exclude), ``coll:A,B;coll2:C``. Returns ``value``."""
    lowered = {c.lower(): c for c in choices}
    for part in value.split(";"):
        part = part.strip()
        if not part:
            raise ConfigError(f"{name}={value!r}: empty entry between ';'.")
        if ":" in part:
            collective, part = part.split(":", 1)
            if collective.strip().lower() not in _COLLECTIVES:
                raise ConfigError(
                    f"{name}={value!r}: unknown collective {collective!r}; known: {', '.join(_COLLECTIVES)}."
                )
        for item in part.lstrip("^").split(","):
            if item.strip().lower() not in lowered:
                raise ConfigError(
                    f"{name}={value!r}: unknown value {item.strip()!r}; "
                    f"allowed (case-insensitive): {', '.join(choices)}, as a comma list, "
                    f"'^' to exclude, or 'allreduce:tree;broadcast:ring'."
                )
    return value


@strict
@dataclass(frozen=True)
class NcclSettings:
    """The NCCL knobs ``turbotrain launch`` passes through (None leaves NCCL's own default)."""

    algo: str | None = None
    proto: str | None = None
    buffsize: int | None = None
    socket_ifname: str | None = None
    ib_disable: bool | None = None
    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] | None = None
    extra: tuple[str, ...] = ()
    """Any other NCCL variable as 'NCCL_NAME=value'."""

    def _check(self) -> None:
        if self.algo is not None:
            _check_choice_list("NCCL_ALGO", self.algo, ALGORITHMS)
        if self.proto is not None:
            _check_choice_list("NCCL_PROTO", self.proto, PROTOCOLS)
        if self.buffsize is not None:
            if self.buffsize <= 0:
                raise ConfigError(f"NCCL_BUFFSIZE={self.buffsize}: must be a positive number of bytes.")
            if self.buffsize & (self.buffsize - 1):
                log.warning(
                    "turbotrain: NCCL_BUFFSIZE=%d is not a power of two; NCCL's documentation recommends powers of two",
                    self.buffsize,
                )
        for item in self.extra:
            key, sep, _ = item.partition("=")
            if not sep or not re.fullmatch(r"NCCL_[A-Z0-9_]+", key):
                raise ConfigError(f"--nccl-env {item!r}: expected NCCL_NAME=value (an NCCL variable).")

    def to_env(self) -> dict[str, str]:
        """The environment variables these settings mean."""
        env: dict[str, str] = {}
        if self.algo is not None:
            env["NCCL_ALGO"] = self.algo
        if self.proto is not None:
            env["NCCL_PROTO"] = self.proto
        if self.buffsize is not None:
            env["NCCL_BUFFSIZE"] = str(self.buffsize)
        if self.socket_ifname is not None:
            env["NCCL_SOCKET_IFNAME"] = self.socket_ifname
            env["GLOO_SOCKET_IFNAME"] = self.socket_ifname  # the CPU backend picks its interface the same way
        if self.ib_disable is not None:
            env["NCCL_IB_DISABLE"] = "1" if self.ib_disable else "0"
        if self.debug is not None:
            env["NCCL_DEBUG"] = self.debug
        for item in self.extra:
            key, _, value = item.partition("=")
            env[key] = value
        return env


def check_environment(env: Mapping[str, str]) -> list[str]:
    """Problems with NCCL variables already set in ``env`` (bad values, slow debug settings)."""
    problems: list[str] = []
    checks = (
        ("NCCL_ALGO", lambda v: _check_choice_list("NCCL_ALGO", v, ALGORITHMS)),
        ("NCCL_PROTO", lambda v: _check_choice_list("NCCL_PROTO", v, PROTOCOLS)),
        ("NCCL_BUFFSIZE", lambda v: NcclSettings(buffsize=parse_size(v))),
    )
    for key, check in checks:
        if key in env:
            try:
                check(env[key])
            except ConfigError as exc:
                problems.append(str(exc))
    debug = env.get("NCCL_DEBUG", "").upper()
    if debug and debug not in _DEBUG_LEVELS:
        problems.append(f"NCCL_DEBUG={env['NCCL_DEBUG']!r}: allowed: {', '.join(_DEBUG_LEVELS)}.")
    elif debug in ("INFO", "TRACE"):
        problems.append(
            f"NCCL_DEBUG={debug} logs every communicator set-up (TRACE: every call) and slows training; "
            "unset it or use WARN outside of debugging."
        )
    return problems
