"""``python -m turbotrain ...`` for the tests, forked from one interpreter that imported torch and turbotrain.

A new interpreter spends ~3 s of each test on imports before the command's first line. The fork runs ``python -m
turbotrain`` as a new interpreter would (doctor/fixes/warm_start.py says how, and what it refuses, in which case the
command starts cold). Tests of the command line's own start-up, or under a prefix (``unshare``), start it cold.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from turbotrain.doctor.fixes.warm_start import WarmStart

__all__ = ["turbotrain_command", "close_warm_commands"]

PRELOAD = ("torch", "torch._dynamo", "turbotrain.cli", "turbotrain.doctor.diagnose", "turbotrain.doctor.cli",
           "turbotrain.launch.cli", "torch.distributed.run")
_warm: list[WarmStart] = []


def turbotrain_command(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``python -m turbotrain *argv``: its exit code and output, as ``subprocess.run(..., capture_output=True)``."""
    command = [sys.executable, "-m", "turbotrain", *argv]
    if not _warm:
        _warm.append(WarmStart(env, tempfile.mkdtemp(prefix="turbotrain-commands-"), preload=PRELOAD, any_env=True))
    done = _warm[0].run("turbotrain", argv, env, str(cwd), timeout)
    if done is None:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode is None:
        raise subprocess.TimeoutExpired(command, timeout, done.stdout, done.stderr)
    return subprocess.CompletedProcess(command, done.returncode, done.stdout, done.stderr)


def close_warm_commands() -> None:
    """The session's end: the server and its output folder go."""
    while _warm:
        warm = _warm.pop()
        warm.close()
        shutil.rmtree(warm.folder, ignore_errors=True)
