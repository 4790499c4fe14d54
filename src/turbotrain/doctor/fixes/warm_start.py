"""A warm start for ``--verify``'s runs: one interpreter imports torch once, then forks a process per run.

Each run of the original or a patched script is a process of its own (nothing one run sets reaches the next),
and a new interpreter spends about 3 s importing torch and ``torch._dynamo`` (every optimizer imports it) before
the script's first line: most of a short run. The server here imports them, and turbotrain's child, and touches
nothing else: no tensor op, no thread of its own, no CUDA; each run is a fork of it that runs ``python -m MODULE
ARGS`` as a new interpreter would from there (its own environment, folder, output files and exit), with an
allocator that has freed nothing yet, as a new interpreter's has (:mod:`turbotrain.fresh_trial` says why that
matters).

A run the server cannot start the same way (another environment than the one it was started with; a server whose
imports started a Python thread or loaded the CUDA driver, which a fork does not carry over; off Linux) is answered
``None``, and the caller starts a new interpreter, as before.

``python -m turbotrain.doctor.fixes.warm_start PARENT_PID MODULE...`` is the server: one JSON line per request on
its stdin, JSON lines back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from ...fork_server import JsonLines, exit_code_of, refusal, say, stop_server

__all__ = ["Finished", "WarmStart", "PRELOAD"]

PRELOAD = ("torch", "torch._dynamo", "turbotrain.doctor.fixes.child")
_READY_S = 120.0  # the server's imports, on a loaded machine
_EXIT_S = 5.0


@dataclass
class Finished:
    """How one run ended: its exit code (None: killed at its time limit) and its output."""

    returncode: int | None
    stdout: str
    stderr: str
    pid: int


class WarmStart:
    """The server, started with ``env``; :meth:`run` forks a process per run, or answers None (start one cold).

    ``any_env``: a run may have another environment than the server's. The kernel shows a fork the server's
    (``/proc/PID/environ``), which is how the doctor's guard finds its processes; a caller whose runs nobody looks
    for that way (the test suite's doctor command lines) may set it."""

    def __init__(
        self, env: Mapping[str, str], folder: str, preload: tuple[str, ...] = PRELOAD, any_env: bool = False
    ) -> None:
        self.env = dict(env)
        self.any_env = any_env
        self.folder = folder  # where each run's stdout and stderr files go
        self.pid: int | None = None  # the server's, once it is ready
        self._runs = 0
        self._lines: JsonLines | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        if not sys.platform.startswith("linux"):
            return
        module = __name__
        self._proc = subprocess.Popen(
            [sys.executable, "-m", module, str(os.getpid()), *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self.env,
        )
        reply = self._reply(_READY_S)
        if reply is None or not reply.get("ready"):
            self.close()  # it says why (a thread, CUDA) or died: every run starts cold
            return
        self.pid = self._proc.pid

    def run(self, module: str, argv: list[str], env: Mapping[str, str], cwd: str, timeout_s: float) -> Finished | None:
        """``python -m module *argv`` in ``cwd`` with ``env``, forked from the server; None where it cannot be."""
        if self._proc is None or self.pid is None or self._proc.poll() is not None:
            return None
        if not self.any_env and dict(env) != self.env:
            return None
        self._runs += 1
        out, err = (os.path.join(self.folder, f"run-{self._runs}.{name}") for name in ("stdout", "stderr"))
        request = {"module": module, "argv": argv, "env": dict(env), "cwd": cwd, "stdout": out, "stderr": err}
        try:
            assert self._proc.stdin is not None  # stdin=PIPE
            self._proc.stdin.write(json.dumps(request).encode() + b"\n")
            self._proc.stdin.flush()
        except OSError:
            self.close()
            return None
        started = self._reply(_READY_S)
        if started is None or "pid" not in started:
            self.close()
            return None
        pid = int(started["pid"])
        ended = self._reply(timeout_s)
        killed = ended is None
        if killed:
            _kill(pid)
            ended = self._reply(_EXIT_S)
        if ended is None:  # the server itself is stuck: nothing more is started from it
            self.close()
        returncode = None if killed or ended is None else int(ended["returncode"])
        return Finished(returncode, _read(out), _read(err), pid)

    def close(self) -> None:
        proc, self._proc, self.pid = self._proc, None, None
        if proc is not None:
            stop_server(proc, self._lines)  # the server's loop ends on end-of-file

    def _reply(self, timeout_s: float) -> dict[str, Any] | None:
        assert self._proc is not None
        if self._lines is None:
            self._lines = JsonLines(self._proc)
        return self._lines.next(timeout_s)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


# -- the server ------------------------------------------------------------------------------------------------


_STARTED_IN = os.getcwd()


def serve(parent: int, preload: list[str]) -> None:
    import importlib

    from ...fresh_trial import die_with_parent

    die_with_parent(parent)
    for name in preload:
        importlib.import_module(name)
    why = refusal()
    say({"ready": why is None, "refused": why})
    if why is not None:
        return
    for line in sys.stdin.buffer:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)  # never returns
        say({"pid": pid})
        _, status = os.waitpid(pid, 0)
        say({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})


def _child(request: dict[str, Any]) -> None:
    """In the fork: become ``python -m MODULE ARGV`` run in the request's folder, environment and files."""
    code: int = 1
    try:
        os.chdir(request["cwd"])
        if sys.path and sys.path[0] == _STARTED_IN:
            sys.path[0] = os.getcwd()  # `-m` puts the folder it starts in first: the run's, not the server's
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile

        tempfile.tempdir = None  # a new interpreter reads TMPDIR (this environment) on first use
        # The server's pipes are fds 0 and 1: replaced here, so the run holds no end of them.
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        code = _run_module(request["module"], request["argv"])
    finally:
        os._exit(code)


def _run_module(module: str, argv: list[str]) -> int:
    """What the interpreter does for ``-m module``, then at its exit: the exit code."""
    import runpy

    sys.argv = [module, *argv]
    return exit_code_of(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2:])
