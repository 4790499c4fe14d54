"""Named fault points for fault-injection tests.

``TURBOTRAIN_FAULT=<name>[,<name>...]`` makes the process kill itself with SIGKILL when it
reaches that point, e.g. ``checkpoint-between-data-and-commit``: the checkpoint's bytes are
on disk but its manifest (the commit) is not. Only ever read at rare moments (checkpoint
saves), never in the per-step path.
"""

from __future__ import annotations

import os
import signal

FAULT_POINTS = ("checkpoint-between-data-and-commit",)


def fault_point(name: str) -> None:
    armed = os.environ.get("TURBOTRAIN_FAULT")
    if armed and name in armed.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
