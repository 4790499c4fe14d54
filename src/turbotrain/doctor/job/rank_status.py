"""What a rank is doing, written ten times a second to the job's folder: the doctor reads it to see progress, and
to say where a rank was when it crashed or hung (its step, its phase, the user's line it was on)."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..sites import is_user_file

if TYPE_CHECKING:
    from ..record.recorder import Recorder

__all__ = ["Heartbeat", "status_path", "result_path", "read_json", "PHASE_WORDS"]

# The recorder's phases in words, for "rank 1 was <doing this>".
PHASE_WORDS = {
    "data": "waiting for data (DataLoader)",
    "h2d": "copying to the device",
    "forward": "in the forward",
    "backward": "in the backward",
    "optimizer": "in the optimizer step",
    "update": "updating weights",
    "sync": "in a host sync",
    "eval": "evaluating",
    "eval_grad": "evaluating",
    "save": "saving (torch.save)",
}


def status_path(folder: str | os.PathLike, rank: int) -> Path:
    return Path(folder) / f"rank-{rank}.status.json"


def result_path(folder: str | os.PathLike, rank: int) -> Path:
    return Path(folder) / f"rank-{rank}.result.json"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Written whole or not at all (a reader never sees half a file)."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Heartbeat:
    """A daemon thread writing this rank's status (step, phase, line) every ``interval`` seconds."""

    def __init__(self, folder: str | os.PathLike, rank: int, recorder: Recorder, interval: float = 0.1) -> None:
        self.path = status_path(folder, rank)
        self.rank, self.recorder, self.interval = rank, recorder, interval
        self.main = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="turbotrain-doctor-heartbeat", daemon=True)

    def start(self) -> None:
        self.write()
        self._thread.start()

    def stop(self, state: str) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.write(state)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.write()
            except Exception:  # noqa: BLE001 - a status that cannot be written costs the status, not the run
                continue

    def write(self, state: str = "running") -> None:
        recorder = self.recorder
        top = recorder.clock.top
        doing = PHASE_WORDS.get(top.phase, top.phase) if top is not None else None
        if recorder.gradient_sync.in_flight():
            doing = "waiting for the gradient all-reduce (DDP, in the backward)"
        elif recorder.blocking.open is not None:
            doing = f"waiting in torch.distributed.{recorder.blocking.open}"
        write_json(
            self.path,
            {
                "rank": self.rank,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "state": state,
                "step": len(recorder.steps),
                "doing": doing,
                "where": self._where(),
                "time": time.time(),
            },
        )

    def _where(self) -> str | None:
        """The user's innermost line the script's thread is on."""
        frame = sys._current_frames().get(self.main)
        while frame is not None:
            if is_user_file(frame.f_code.co_filename):
                return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
            frame = frame.f_back
        return None
