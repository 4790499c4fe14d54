"""Run a bit of Python in a real pseudo-terminal (a detached tmux session) and read its screen."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import pytest


def _tmux() -> str:
    exe = shutil.which("tmux")
    if exe is None:
        pytest.fail("tmux is not installed: run scripts/ci-deps.sh (apt-get install tmux)")
    return exe


def in_terminal(code: str, columns: int, path: str = "", timeout_s: float = 120.0) -> list[str]:
    """Run ``python -c code`` in a tmux pane ``columns`` wide (``path`` on PYTHONPATH); the lines it printed.

    The pane is a real terminal: the program sees its width through the terminal's size (COLUMNS is
    unset). Lines the terminal wrapped come back joined, so a line wider than the pane shows as such.
    The tmux server, and the program with it, is killed before returning.
    """
    tmux, done, sockets = _tmux(), f"__done_{uuid.uuid4().hex[:6]}__", tempfile.mkdtemp(prefix="tt-tmux-")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
    tests = os.path.dirname(os.path.abspath(__file__))  # this helper, imported by the test modules run there
    env["PYTHONPATH"] = os.pathsep.join(p for p in (path, tests, env.get("PYTHONPATH", "")) if p)
    command = f"{sys.executable} -c {code!r}; echo {done}; sleep 600"
    base = [tmux, "-S", os.path.join(sockets, "socket"), "-f", "/dev/null", "-u"]
    try:
        subprocess.run([*base, "new-session", "-d", "-x", str(columns), "-y", "200", "-c", os.getcwd(),
                        command], check=True, env=env, timeout=30)
        deadline = time.monotonic() + timeout_s
        while True:
            screen = subprocess.run([*base, "capture-pane", "-p", "-J", "-S", "-", "-t", "0"], capture_output=True,
                                    text=True, check=True, timeout=30).stdout
            if done in screen or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        width = subprocess.run([*base, "display-message", "-p", "-t", "0", "#{pane_width}"], capture_output=True,
                               text=True, timeout=30).stdout.strip()
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True, timeout=30)  # the pane's processes too
        shutil.rmtree(sockets, ignore_errors=True)
    assert width == str(columns), width
    assert done in screen, f"the command did not finish in {timeout_s}s:\n{screen}"
    lines = [line.rstrip() for line in screen.splitlines()]
    return lines[:next(i for i, line in enumerate(lines) if done in line)]


def check_layout(lines: list[str], columns: int, tokens: tuple[str, ...] = ()) -> None:
    """No line wider than the terminal, no column squeezed to a word a line, every token whole on a line."""
    wide = [line for line in lines if len(line) > columns]
    assert not wide, f"wider than {columns} columns: {wide}"
    lone = [len(line.split()) == 1 and not re.search(r"[=█]", line) for line in lines]  # a switch a line is fine
    for i in range(len(lines) - 1):
        assert not (lone[i] and lone[i + 1]), f"one word a line: {lines[i]!r}, {lines[i + 1]!r}"
    for token in tokens:
        assert any(token in line for line in lines), f"{token!r} is split across lines or missing"
