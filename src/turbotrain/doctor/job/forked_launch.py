"""Starting a job's launcher: ``turbotrain launch`` (the launcher ``doctor --nproc-per-node`` builds) is forked
from the doctor's own process, any other command is a new process.

``turbotrain launch`` is torchrun run in-process, and torchrun imports torch: a fresh interpreter spends 2-3 s
of CPU on that before any rank starts, once per run of the job, and a job what-if runs the job again for each
fix and round. The doctor has torch imported already, so a fork starts the launcher without it. The ranks are
new processes as ever (torchrun starts them), so nothing measured runs in a forked process. A fork is taken
only from a process that runs no other thread (a lock another thread holds would stay held in the child) and
where the launcher inherits this process's output; otherwise, and off Linux, the launcher is a new process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import IO, Any, NoReturn, Sequence

__all__ = ["ForkedLauncher", "own_launch_argv", "start_launcher"]


class ForkedLauncher:
    """The forked launcher, with the part of ``subprocess.Popen``'s interface the job's supervision uses."""

    def __init__(self, pid: int, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: it has ended, how is not known
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode


def own_launch_argv(command: Sequence[str]) -> list[str] | None:
    """``turbotrain``'s arguments where ``command`` runs this interpreter's ``turbotrain launch``, else None."""
    prefix = [sys.executable, "-m", "turbotrain", "launch"]
    return list(command[3:]) if list(command[:4]) == prefix else None


def start_launcher(
    command: Sequence[str],
    env: dict[str, str],
    cwd: str | os.PathLike | None,
    stdout: IO[str] | int | None,
    stderr: IO[str] | int | None,
) -> subprocess.Popen | ForkedLauncher:
    """Start ``command`` in a session of its own: forked where :mod:`this module <.forked_launch>` allows it."""
    argv = own_launch_argv(command)
    forkable = (
        argv is not None
        and sys.platform.startswith("linux")
        and stdout is None
        and stderr is None
        and threading.active_count() == 1
        and threading.current_thread() is threading.main_thread()  # the child dies with the thread that forked
    )
    if not forkable:
        return subprocess.Popen(command, env=env, cwd=cwd, start_new_session=True, stdout=stdout, stderr=stderr)
    assert argv is not None  # forkable says so
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()  # or the child writes this process's buffered output again
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _run_in_child(argv, env, cwd, parent)
    return ForkedLauncher(pid, command)


def _run_in_child(argv: list[str], env: dict[str, str], cwd: str | os.PathLike | None, parent: int) -> NoReturn:
    code: Any = 1
    try:
        os.setsid()
        from ...fresh_trial import die_with_parent

        # A guard finds a job's processes by a mark in their environment as the kernel shows it, which a fork
        # does not change: this one ends with the doctor instead.
        die_with_parent(parent)
        if cwd is not None:
            os.chdir(cwd)
        _default_signal_handlers()
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [sys.executable, "-m", "turbotrain", *argv]
        from ...cli import main

        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - the child must reach os._exit, or it would go on running the doctor
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a stream that cannot flush must not change the exit code
                pass
        # os._exit: this process's atexit handlers and finalizers are the doctor's, not the launcher's.
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))


def _default_signal_handlers() -> None:
    """The signal handlers a fresh interpreter starts with, in place of any the doctor set."""
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
