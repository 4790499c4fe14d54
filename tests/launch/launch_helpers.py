"""Helpers for the launch tests: run `turbotrain launch` as a user would, read what the ranks wrote.

A module of its own with a name no other test directory uses (not conftest.py: with tests/launch
and tests/data in one pytest run, ``from conftest import ...`` would find the other directory's).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from warm_command import TEST_RUN, TEST_RUN_ID, turbotrain_command, warm_ranks_env

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "workers" / "train_tiny.py"


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    env.update(extra)
    return env


def run_launch(*args: str, timeout: float = 180, prefix: tuple[str, ...] = (), warm_ranks: bool = True,
               **env_extra: str) -> subprocess.CompletedProcess:
    """``turbotrain launch ARGS`` as a user runs it, whatever its exit code: forked warm where there is no
    ``prefix``, its ranks forked from the session's warm-rank server unless ``warm_ranks`` is False, where a rank
    must be the launcher's child (warm_command.py)."""
    env = cli_env(**{TEST_RUN: TEST_RUN_ID}, **env_extra)
    if prefix:
        return subprocess.run([*prefix, sys.executable, "-m", "turbotrain", "launch", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
    # The session's server has the environment torchrun gives each of several ranks: one OpenMP thread.
    ranks = warm_ranks_env({**env, "OMP_NUM_THREADS": "1"}) if warm_ranks else {}
    return turbotrain_command(["launch", *args], cwd=ROOT, env={**env, **ranks}, timeout=timeout)


def launch(*args: str, timeout: float = 180, prefix: tuple[str, ...] = (), warm_ranks: bool = True
           ) -> subprocess.CompletedProcess:
    """:func:`run_launch` that fails the test with its output if the launch fails."""
    proc = run_launch(*args, timeout=timeout, prefix=prefix, warm_ranks=warm_ranks)
    if proc.returncode != 0:
        pytest.fail(f"turbotrain launch {' '.join(args)} exited {proc.returncode}\n"
                    f"{proc.stdout}\n{proc.stderr[-6000:]}")
    return proc


def run_worker(out: Path, *worker_args: str, launch_args: tuple[str, ...] = ("--nproc-per-node", "2")) -> Path:
    """Launch tests/launch/workers/train_tiny.py writing into ``out``; returns ``out``."""
    launch(*launch_args, str(WORKER), "--out", str(out), *worker_args)
    return out


def read_rank(out: Path, config: str, rank: int) -> dict:
    return torch.load(out / f"{config}-rank{rank}.pt", weights_only=False)


def assert_same_weights(a: dict, b: dict, exact: bool = False) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if exact:
            assert torch.equal(a[key], b[key]), f"{key} differs by {(a[key] - b[key]).abs().max().item():.3g}"
        else:
            torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=lambda m, key=key: f"{key}: {m}")
