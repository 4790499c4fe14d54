"""A job on several nodes: every rank's result reaches every node's doctor through torchrun's own store.

Each node runs its own ``turbotrain doctor -- torchrun --nnodes N ...`` and sees only its own ranks' files. The
elastic agent of node 0 hosts a TCPStore that every rank can reach (``TORCHELASTIC_USE_AGENT_STORE``, at
``MASTER_ADDR:MASTER_PORT``): each rank puts its result there, and each node's local rank 0 copies the others'
into its node's job folder before it exits, so every node's doctor reports the whole job. The agent's store lives
until node 0's ranks have exited, so the collectors meet once more after collecting: node 0's does not leave (and
take the store with it) while another node's is still reading.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any

from .rank_status import result_path, write_json

__all__ = ["spans_nodes", "share_result"]

COLLECT_TIMEOUT_S = 60.0  # every rank of a job that got this far writes its result within moments of the others
_PREFIX = "turbotrain/doctor"


def spans_nodes(env: dict[str, str] | os._Environ = os.environ) -> bool:
    """This rank's torchrun job has ranks on other nodes, and their agent's store is reachable."""
    try:
        nodes = int(env.get("GROUP_WORLD_SIZE", "1"))
    except ValueError:
        return False
    return nodes > 1 and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and bool(env.get("MASTER_ADDR"))


def _store() -> Any:
    from torch.distributed import TCPStore

    return TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=COLLECT_TIMEOUT_S),
    )


def share_result(folder: str, rank: int, result: dict[str, Any]) -> str | None:
    """Put this rank's result in the store; on a node's local rank 0, copy every other rank's into ``folder``.
    Returns why the sharing failed (the node's own ranks are still reported), or None."""
    env = os.environ
    key = f"{_PREFIX}/{env.get('TORCHELASTIC_RUN_ID', 'run')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    world, nodes = int(env.get("WORLD_SIZE", "1")), int(env.get("GROUP_WORLD_SIZE", "1"))
    try:
        store = _store()
        store.set(f"{key}/rank-{rank}", json.dumps(result))
        if env.get("LOCAL_RANK") != "0":
            return None
        others = [r for r in range(world) if r != rank]
        store.wait([f"{key}/rank-{r}" for r in others], timedelta(seconds=COLLECT_TIMEOUT_S))
        for r in others:
            write_json(result_path(folder, r), json.loads(store.get(f"{key}/rank-{r}")))
    except Exception as exc:  # noqa: BLE001 - a node whose peers never sent theirs still reports its own ranks
        return f"{type(exc).__name__}: {exc}"
    try:  # the meeting after collecting; a store already gone means every other node had collected
        store.add(f"{key}/collected", 1)
        deadline = time.monotonic() + COLLECT_TIMEOUT_S
        while store.add(f"{key}/collected", 0) < nodes and time.monotonic() < deadline:
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - the store went with node 0: every node had collected
        pass
    return None
