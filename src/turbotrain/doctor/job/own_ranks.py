"""Seeing a script start its own ranks: Lightning's ``Trainer(strategy="ddp", devices=N)`` (and Fabric's) runs
``python train.py`` again with ``LOCAL_RANK=1..N-1`` from the first process, which becomes rank 0.

Run in the doctor's own process, such a script would leave its other ranks unrecorded and waiting for rank 0
forever once the doctor ends it. So while the script runs in the doctor's process, the first such start is
refused with :class:`StartsOwnRanks` (before any rank exists) and the doctor runs the script as a job instead,
every rank recorded (:mod:`.job`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..record.patcher import Patcher

__all__ = ["StartsOwnRanks", "StartsRanks", "refusing_own_ranks"]


class StartsRanks(BaseException):
    """The script was about to start a rank of its own (a BaseException: the script's ``except Exception``
    must not swallow it); the doctor runs it as a job instead."""

    def command(self, script: str, argv: list[str]) -> list[str]:
        """The job's command: the launcher that runs ``script`` with every rank recorded."""
        return [sys.executable, script, *argv]

    def said(self, base: str | None = None) -> str:
        """The report's first note: why the doctor ran the script as a job (places relative to ``base``)."""
        raise NotImplementedError


class StartsOwnRanks(StartsRanks):
    """The script was about to run itself again as another rank (Lightning's and Fabric's DDP)."""

    def __init__(self, local_rank: str, world_size: str | None) -> None:
        self.local_rank = local_rank
        self.world_size = world_size
        size = f" of {world_size}" if world_size else ""
        super().__init__(f"rank {local_rank}{size} with LOCAL_RANK={local_rank}")

    def said(self, base: str | None = None) -> str:
        return (
            f"The script starts its own ranks (it was starting {self}, as Lightning's and Fabric's DDP do), so the "
            "doctor ran it as a job: its first process recorded as rank 0, each rank it starts as its own."
        )


def _starts_a_rank(env: Any) -> StartsOwnRanks | None:
    env = os.environ if env is None else env
    try:
        local = str(env.get("LOCAL_RANK", ""))
    except AttributeError:  # an env that is not a mapping: Popen itself will say so
        return None
    if local.isdigit() and local != os.environ.get("LOCAL_RANK", "0"):
        return StartsOwnRanks(local, env.get("WORLD_SIZE"))
    return None


@contextmanager
def refusing_own_ranks() -> Iterator[None]:
    """While inside, a ``subprocess.Popen`` given another ``LOCAL_RANK`` than this process's raises
    :class:`StartsOwnRanks` instead of starting it; every other process starts as usual."""
    patcher = Patcher()

    def make(original: type[subprocess.Popen]) -> type[subprocess.Popen]:
        class RankRefusingPopen(original):  # type: ignore[valid-type,misc]  # a subclass of whatever Popen is now
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                refused = _starts_a_rank(kwargs.get("env"))
                if refused is not None:
                    raise refused
                super().__init__(*args, **kwargs)

        return RankRefusingPopen

    patcher.replace(subprocess, "Popen", make)
    try:
        yield
    finally:
        patcher.restore()
