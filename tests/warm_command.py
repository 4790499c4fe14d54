"""``python -m turbotrain ...`` for the tests, and the ranks of the doctor's jobs, forked from interpreters that
imported torch and turbotrain once.

A new interpreter spends ~3 s of each test on imports before the command's first line. The fork runs ``python -m
turbotrain`` as a new interpreter would (doctor/fixes/warm_start.py says how, and what it refuses, in which case the
command starts cold). Tests of the command line's own start-up, or under a prefix (``unshare``), start it cold.

A doctor run starts its own warm-rank server for the runs that repeat its job (doctor/job/warm_ranks.py), so the
first run of each job, the recording, starts cold ranks: the session's one server (:func:`warm_ranks_env`) starts
them warm too, the doctor taking it as a user's ``PYTHON_EXEC``. In the same way each ``--verify`` starts a server
for its runs (doctor/fixes/verify.py): the doctors the tests run in their own process fork them from the session's
one (:func:`verify_start`); ``--verify`` through the command line keeps its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from turbotrain.doctor.fixes.warm_start import WarmStart
from turbotrain.doctor.job.warm_ranks import WarmRanks

__all__ = ["turbotrain_command", "warm_ranks_env", "warm_ranks_pid", "verify_start", "close_warm_commands", "TEST_RUN",
           "TEST_RUN_ID", "RANK_ENV"]

PRELOAD = ("torch", "torch._dynamo", "turbotrain.cli", "turbotrain.doctor.diagnose", "turbotrain.doctor.cli",
           "turbotrain.launch.cli", "torch.distributed.run")
_warm: list[WarmStart] = []
_ranks: list[WarmRanks] = []
_verify: list[WarmStart] = []
# What differs between the doctor runs of one session and no import reads: pytest's test name, the test's own tune
# cache and temporary folder (and the Inductor cache folder torch's import names after it), the doctor run's mark.
# Marks the processes this test run (this worker) starts: doctor_helpers.job_processes finds what a test left by it.
TEST_RUN = "TURBOTRAIN_TEST_RUN"
TEST_RUN_ID = f"{os.getpid()}-{os.urandom(4).hex()}"
# What a rank's environment holds beyond its launcher's, and so the session's warm-rank server's too: the run's mark,
# and one OpenMP thread (torchrun's default with several processes; a thread count is read at torch's import, so a
# server without it would start every such rank cold).
RANK_ENV = {TEST_RUN: TEST_RUN_ID, "OMP_NUM_THREADS": "1"}
PER_TEST = ("PYTEST_CURRENT_TEST", "TURBOTRAIN_CACHE", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TURBOTRAIN_DOCTOR_RUN")
# Read once, on import: the test that starts a server may have pointed TMPDIR at its own folder, which the server's
# folder would then litter for the rest of the session.
_SESSION_ROOT = tempfile.gettempdir()


def _session_folder(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix, dir=_SESSION_ROOT)


def turbotrain_command(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``python -m turbotrain *argv``: its exit code and output, as ``subprocess.run(..., capture_output=True)``."""
    command = [sys.executable, "-m", "turbotrain", *argv]
    if not _warm:
        _warm.append(WarmStart(env, _session_folder("turbotrain-commands-"), preload=PRELOAD, any_env=True))
    done = _warm[0].run("turbotrain", argv, env, str(cwd), timeout)
    if done is None:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode is None:
        raise subprocess.TimeoutExpired(command, timeout, done.stdout, done.stderr)
    return subprocess.CompletedProcess(command, done.returncode, done.stdout, done.stderr)


def warm_ranks_env(env: dict[str, str]) -> dict[str, str]:
    """What a doctor's environment adds for its job's ranks to start from the session's warm-rank server, which the
    first call starts with ``env`` (the job's, as doctor_helpers.job_env() makes it); nothing where it is not up."""
    if not _ranks:
        _ranks.append(WarmRanks(env, _session_folder("turbotrain-ranks-"), may_differ=PER_TEST))
    return _ranks[0].env()


def warm_ranks_pid() -> int | None:
    """The session's warm-rank server, which stays up between tests (not a process a test left behind)."""
    return _ranks[0].pid if _ranks else None


class _SessionStart:
    """What a Verifier holds of its server: the session's, which its end leaves running."""

    def __init__(self, server: WarmStart) -> None:
        self.server = server
        self.pid = server.pid
        self.run = server.run

    def close(self) -> None:
        pass


def verify_start(env: dict[str, str], folder: str) -> _SessionStart:
    """In place of ``WarmStart(env, folder)`` in doctor/fixes/verify.py: the session's server, started by the first
    call with ``env`` (less the doctor run's mark, or that run's guard would end it) and the same imports; each run's
    environment is its own (``any_env``)."""
    from turbotrain.doctor.fixes.warm_start import PRELOAD as VERIFY_PRELOAD
    from turbotrain.doctor.lifeline import ENV_MARK

    if not _verify:
        env = {k: v for k, v in env.items() if k != ENV_MARK}
        _verify.append(WarmStart(env, _session_folder("turbotrain-verify-"), VERIFY_PRELOAD, any_env=True))
    return _SessionStart(_verify[0])


def close_warm_commands() -> None:
    """The session's end: the servers and their folders go."""
    for server in (*_warm, *_ranks, *_verify):
        server.close()
        shutil.rmtree(server.folder, ignore_errors=True)
    _warm.clear()
    _ranks.clear()
    _verify.clear()
