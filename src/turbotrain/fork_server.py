"""What the servers that fork processes to run as new interpreters would share (``--verify``'s runs:
doctor/fixes/warm_start.py; a job's warm ranks: doctor/job/warm_ranks.py): their messages as JSON lines, their end,
when a fork of it would not run like a new interpreter, and what the interpreter does at a program's exit."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Any, Callable

__all__ = ["JsonLines", "stop_server", "say", "refusal", "exit_code_of"]

_EXIT_S = 5.0


class JsonLines:
    """A server process's JSON lines, one per message, on its standard output."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None  # stdout=PIPE
        self.fd = proc.stdout.fileno()
        self._buffer = b""

    def next(self, timeout_s: float) -> dict[str, Any] | None:
        """The next line, or None at the time limit or the server's end."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)


def stop_server(proc: subprocess.Popen[bytes], lines: JsonLines | None) -> dict[str, Any] | None:
    """End a server that ends at the end of its input: its last line (None if it said nothing more), then its exit;
    killed where it takes longer than a few seconds."""
    last = None
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        while lines is not None and (line := lines.next(_EXIT_S)) is not None:
            last = line
        proc.wait(timeout=_EXIT_S)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    return last


def say(message: dict[str, Any]) -> None:
    """A server's message: one JSON line on its standard output."""
    sys.stdout.buffer.write(json.dumps(message).encode() + b"\n")
    sys.stdout.buffer.flush()


def refusal() -> str | None:
    """Why a fork of this process would not run like a new interpreter, or None. (NumPy's OpenBLAS starts its
    threads at import: its own fork handlers stop and restart them, as for every forked DataLoader worker.)"""
    import threading

    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads after the imports (a fork carries one)"
    with open("/proc/self/maps") as fh:
        if "libcuda.so" in fh.read():
            return "the CUDA driver is loaded (a fork cannot use it)"
    return None


def exit_code_of(run: Callable[[], object]) -> int:
    """Run the main program ``run`` and what a new interpreter does at its exit; the exit code."""
    import atexit
    import threading
    import traceback

    code = 0
    try:
        run()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - an uncaught error of the run: printed and exit 1, as the interpreter does
        traceback.print_exc()
        code = 1
    # A new interpreter's exit: wait for the run's non-daemon threads, then its atexit functions (DataLoader
    # workers are joined there), as multiprocessing's own children do.
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own exit step; no public name
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code
