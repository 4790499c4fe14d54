"""Running the user's script unmodified, as ``__main__`` with its own argv, under a recording."""

from __future__ import annotations

import builtins
import gc
import os
import runpy
import sys
import time
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, TracebackType
from typing import Any, Callable

import torch

from .memory_limit import enforced
from .recorder import Recorder, Stop
from ..sites import Site, raised_at

__all__ = ["ScriptRun", "run_script", "run_target"]


@dataclass
class ScriptRun:
    """How the script ended. ``status``: ``stopped`` (enough steps, the doctor ended it), ``finished``
    (it ended by itself), ``error`` (it raised) or ``exit`` (it called sys.exit with a failure code)."""

    script: str
    argv: list[str]
    status: str
    seconds: float
    error: str | None = None
    error_site: Site | None = None
    traceback: str | None = None
    exit_code: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status in ("error", "exit")


def error_site_of(tb: TracebackType | None) -> Site | None:
    """The innermost line of the user's code the error was raised under (:func:`..sites.raised_at`)."""
    return raised_at(tb)


def _run_as_main(code: CodeType, path: str, init_globals: dict[str, Any]) -> None:
    """What ``runpy.run_path`` does with a file, for code compiled from it here: a fresh ``__main__`` module for
    the run, the old one back after it."""
    main = types.ModuleType("__main__")
    main.__dict__.update(init_globals)
    main.__dict__.update(
        __file__=path, __cached__=None, __loader__=None, __package__="", __spec__=None, __builtins__=builtins
    )
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)  # noqa: S102 - the user's own script, as python would run it
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved
        else:
            del sys.modules["__main__"]


def run_script(
    script: str | os.PathLike,
    argv: list[str],
    recorder: Recorder,
    code: CodeType | None = None,
    init_globals: dict[str, Any] | None = None,
) -> ScriptRun:
    """Run ``script`` as ``python script argv...`` would, with ``recorder`` installed. ``code``: the script as
    compiled with a job what-if's edit (apply/rarer_branch.py), run in its place, with ``init_globals``."""
    path = Path(script).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no such script: {script}")
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [str(path), *argv]
    # Like `python script.py`: the script's folder comes first on the import path.
    sys.path.insert(0, str(path.parent))
    run = ScriptRun(script=str(path), argv=list(argv), status="finished", seconds=0.0)

    def body() -> None:
        if code is None:
            runpy.run_path(str(path), run_name="__main__")
        else:
            _run_as_main(code, str(path), init_globals or {})

    try:
        _record(run, recorder, body)
    finally:
        sys.argv = saved_argv
        if sys.path and sys.path[0] == str(path.parent):
            sys.path.pop(0)
        elif saved_path0 is not None and str(path.parent) in sys.path:
            sys.path.remove(str(path.parent))
    return run


def run_target(
    fn: Callable[..., Any],
    args: tuple,
    script: str,
    recorder: Recorder,
    code: CodeType | None = None,
    init_globals: dict[str, Any] | None = None,
) -> ScriptRun:
    """Call ``fn(*args)`` (a function the script started a process to run, in that process) with ``recorder``
    installed. ``code``: the script as compiled with a job what-if's edit, run as the process's main module again
    so that ``fn`` and what it calls are the edited ones."""
    run = ScriptRun(script=script, argv=list(sys.argv[1:]), status="finished", seconds=0.0)

    def body() -> None:
        target = fn
        if code is not None:
            namespace: dict[str, Any] = {**(init_globals or {}), "__name__": "__mp_main__", "__file__": script}
            namespace["__builtins__"] = builtins
            exec(code, namespace)  # noqa: S102 - the user's own script, edited by the what-if being timed
            target = namespace.get(fn.__name__, fn) if fn.__qualname__ == fn.__name__ else fn
        target(*args)

    _record(run, recorder, body)
    return run


def _record(run: ScriptRun, recorder: Recorder, body: Callable[[], None]) -> None:
    """Run ``body`` (the user's code) with ``recorder`` installed; how it ended goes into ``run``."""
    # Autograd switches a script may flip for good (set_detect_anomaly(True), set_grad_enabled(False)): the
    # what-ifs that follow in this process time the model with torch's settings, not the script's leftovers.
    saved_autograd = (torch.is_grad_enabled(), torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    started = time.perf_counter()
    try:
        with recorder, enforced():
            try:
                body()
            except Stop:
                run.status = "stopped"
            except SystemExit as exc:
                exit_code = exc.code
                if exit_code not in (None, 0):
                    run.status, run.exit_code = "exit", exit_code if isinstance(exit_code, int) else 1
                    run.error = f"the script called sys.exit({exit_code!r})"
                    run.error_site = error_site_of(exc.__traceback__)
            except KeyboardInterrupt:
                run.status, run.exit_code, run.error = "error", 130, "interrupted (KeyboardInterrupt)"
            except Exception as exc:  # noqa: BLE001 - the user's failure is reported, not re-raised
                run.status, run.exit_code = "error", 1
                recorder.failed(exc)
                run.error = f"{type(exc).__name__}: {exc}"
                run.error_site = error_site_of(exc.__traceback__)
                run.traceback = "".join(traceback.format_exception(exc))
    finally:
        run.seconds = time.perf_counter() - started
        torch.set_grad_enabled(saved_autograd[0])
        torch.autograd.set_detect_anomaly(saved_autograd[1], check_nan=saved_autograd[2])
        # The user's frames (and its DataLoader workers) go now, not at some later collection.
        gc.collect()
        _end_loader_workers()


def _end_loader_workers() -> None:
    """Shut down the DataLoader workers the script's loaders still hold (``persistent_workers=True`` keeps them on
    the loader after the run). Left to the interpreter's exit, torch terminates them, and each terminated worker
    leaves its multiprocessing folder (``/tmp/pymp-*``) behind; shut down, a worker removes it. A loader iterated
    again (a what-if) starts new workers."""
    from torch.utils.data.dataloader import DataLoader, _MultiProcessingDataLoaderIter

    # type(), not isinstance(): isinstance reads __class__, which some module-level objects answer with a warning.
    for obj in gc.get_objects():
        kind = type(obj)
        if issubclass(kind, _MultiProcessingDataLoaderIter):
            obj._shutdown_workers()  # does nothing for an iterator already shut down
        elif issubclass(kind, DataLoader) and issubclass(type(obj._iterator), _MultiProcessingDataLoaderIter):
            obj._iterator._shutdown_workers()
            obj._iterator = None
