"""Seeing a script start its DDP ranks with ``torch.multiprocessing.spawn`` (or ``start_processes``), the PyTorch
tutorials' way: ``python train.py`` calls ``mp.spawn(train, args=(world,), nprocs=world)`` and each process runs
``train(i, world)`` as rank ``i``.

Run in the doctor's own process, such a script trains in processes no recording sees. So the first such start is
refused with :class:`SpawnsRanks` (before any process exists), and the doctor runs the script as a job instead
(:meth:`SpawnsRanks.command`): one process runs the script unrecorded, as its launcher, and each function it
spawns runs recorded as the rank of its index (:class:`RecordedRank`), writing its recording to the job's folder
as a torchrun rank does (:mod:`.rank_main`).
"""

from __future__ import annotations

import multiprocessing.process
import os
import runpy
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

from .own_ranks import StartsRanks
from ..record.patcher import Patcher
from ..record.process_starts import spawned_rank
from ..sites import Site, user_site

__all__ = ["ENTRY", "RecordedRank", "as_typed", "SpawnsRanks", "main", "refusing_spawned_ranks"]

ENTRY = "turbotrain.doctor.job.spawned_ranks"  # the job's launcher: python -m ENTRY script.py args...


class SpawnsRanks(StartsRanks):
    """The script was about to spawn the first of its ranks."""

    def __init__(self, fn: Callable, where: Site | None, nprocs: int | None) -> None:
        self.target = getattr(fn, "__qualname__", getattr(fn, "__name__", "?"))
        code = fn.__code__
        self.defined = Site(code.co_filename, code.co_firstlineno, self.target)
        self.where, self.nprocs = where, nprocs
        super().__init__(self._started())

    def _started(self, base: str | None = None) -> str:
        count = f"{self.nprocs} processes" if self.nprocs else "processes"
        started = f", from {self.where.where(base)}" if self.where is not None else ""
        return f"{count} running {self.target}() ({self.defined.where(base)}){started}"

    def command(self, script: str, argv: list[str]) -> list[str]:
        return [sys.executable, "-m", ENTRY, script, *argv]

    def said(self, base: str | None = None) -> str:
        return (
            f"The script starts its ranks with torch.multiprocessing.spawn ({self._started(base)}), so the doctor ran "
            "it as a job: the script's own process as their launcher, unrecorded, and each process it spawns "
            "recorded as the rank of its index."
        )


def as_typed(command: list[str]) -> list[str]:
    """``command`` as the user typed it: a job of spawned ranks without the launcher module the doctor put in."""
    if command[1:3] == ["-m", ENTRY]:
        return [command[0], *command[3:]]
    return list(command)


def _nprocs() -> int | None:
    """How many processes the ``start_processes`` call on the stack starts."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "start_processes" and frame.f_code.co_filename.endswith("spawn.py"):
            nprocs = frame.f_locals.get("nprocs")
            return nprocs if isinstance(nprocs, int) else None
        frame = frame.f_back  # type: ignore[assignment]  # the outermost frame's f_back is None, which ends the walk
    return None


@contextmanager
def refusing_spawned_ranks() -> Iterator[None]:
    """While inside, starting a process that runs the user's function as a ``torch.multiprocessing.spawn`` rank
    raises :class:`SpawnsRanks` instead; every other process starts as usual."""
    patcher = Patcher()

    def make(original: Callable) -> Callable:
        def start(self: multiprocessing.process.BaseProcess) -> None:
            spawned = spawned_rank(self)
            if spawned is not None:
                raise SpawnsRanks(spawned[0], user_site(sys._getframe(1)), _nprocs())
            original(self)

        return start

    patcher.replace(multiprocessing.process.BaseProcess, "start", make)
    try:
        yield
    finally:
        patcher.restore()


@dataclass(frozen=True)
class RecordedRank:
    """What a spawned process runs in place of the user's ``fn``: ``fn(i, *args)`` recorded as rank ``i``. Pickled
    into the process with ``fn`` (by reference, as ``fn`` alone would be)."""

    fn: Callable[..., Any]
    nprocs: int | None = None

    def __call__(self, index: int, *args: Any) -> None:
        from ..record.runner import run_target
        from .rank_main import ENV_CLAIMED, ENV_FOLDER, end_rank, record_rank

        os.environ[ENV_CLAIMED] = f"{index}:{os.getpid()}"  # its DataLoader workers and other children record nothing
        main = sys.modules.get("__mp_main__") or sys.modules["__main__"]
        script = getattr(main, "__file__", None) or self.fn.__code__.co_filename
        code = record_rank(
            os.environ[ENV_FOLDER],
            index,
            script,
            lambda recorder, edited, init: run_target(self.fn, (index, *args), script, recorder, edited, init),
            world=self.nprocs,
        )
        end_rank(code)


def _recording_ranks(original: Callable) -> Callable:
    def start(self: multiprocessing.process.BaseProcess) -> None:
        spawned = spawned_rank(self)
        if spawned is not None:
            # spawn's wrapper's arguments, (fn, i, args, error_file), with fn recorded
            recorded = (RecordedRank(spawned[0], _nprocs()), *self._args[1:])  # type: ignore[attr-defined]  # set by Process
            self._args = recorded  # type: ignore[attr-defined]  # Process keeps its target's arguments there
        original(self)

    return start


def main(argv: list[str]) -> int:
    """``python -m turbotrain.doctor.job.spawned_ranks script.py args...``: the script as ``python script.py
    args...`` runs it, its spawned ranks recorded; the script's exit code."""
    if not argv:
        print(f"usage: python -m {ENTRY} script.py [args...]", file=sys.stderr)
        return 2
    script = os.path.abspath(argv[0])
    sys.argv = [script, *argv[1:]]
    sys.path.insert(0, os.path.dirname(script))  # like python script.py: its folder first on the import path
    patcher = Patcher()
    patcher.replace(multiprocessing.process.BaseProcess, "start", _recording_ranks)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)  # sys.exit("message"), as Python itself would say it
        return 1
    finally:
        patcher.restore()
    return 0


if __name__ == "__main__":
    # The module imported by its name, not run as __main__: a RecordedRank must pickle as this module's class.
    from turbotrain.doctor.job.spawned_ranks import main as _main

    sys.exit(_main(sys.argv[1:]))
