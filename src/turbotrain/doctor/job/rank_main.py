"""One rank of a multi-process job under the doctor: the script runs under a recording, and the rank's
``Recording`` (plain JSON) goes to the job's folder, where the doctor gathers every rank's.

The doctor starts the launcher (torchrun, ``turbotrain launch``, ...) with :data:`ENV_FOLDER` set and a folder
holding :data:`SITECUSTOMIZE` first on ``PYTHONPATH``: every Python process the launcher starts runs it at
start-up. A process that is a rank (the launcher gave it ``RANK`` or ``LOCAL_RANK``) and runs a script calls
:func:`from_site` and records itself; any other (the launcher itself, DataLoader workers it spawns) goes on
untouched, without importing turbotrain.

A script that starts its own ranks (Lightning's ``Trainer(strategy="ddp", devices=N)`` runs ``python train.py``
again with ``LOCAL_RANK=1..N-1``) is its own launcher: the doctor starts it with :data:`ENV_ROOT` set, and that
first process records itself as rank 0. A rank's children inherit :data:`ENV_CLAIMED` (the rank's number) and
record nothing, unless they were given another rank number: those are the ranks the script started itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Callable

from .across_nodes import share_result, spans_nodes
from .rank_status import Heartbeat, result_path, write_json

if TYPE_CHECKING:  # pragma: no cover
    from ..record.recorder import Recorder
    from ..record.runner import ScriptRun

__all__ = [
    "ENV_FOLDER",
    "ENV_OPTIONS",
    "ENV_CLAIMED",
    "ENV_ROOT",
    "SITECUSTOMIZE",
    "end_rank",
    "from_site",
    "record_rank",
    "run_rank",
]

ENV_FOLDER = "TURBOTRAIN_DOCTOR_JOB_DIR"  # where ranks write their status and recording
ENV_OPTIONS = "TURBOTRAIN_DOCTOR_JOB_OPTIONS"  # {"steps": 20, "warmup": 3, "profile": 2, "change": {...}}
ENV_CLAIMED = "TURBOTRAIN_DOCTOR_JOB_CLAIMED"  # "rank:pid", set in a rank: its children of that rank record nothing
ENV_ROOT = "TURBOTRAIN_DOCTOR_JOB_ROOT"  # the launcher is the script itself: its first process is rank 0

# Written as ``sitecustomize.py`` into a folder of the job's own (job/launcher.py). The checks come before any import
# of turbotrain, so the launcher and other Python processes pay nothing; a ``sitecustomize`` this one shadows
# (a distribution's, a virtualenv's) still runs.
SITECUSTOMIZE = f'''"""turbotrain doctor: record this process if it is a rank of the job (written by turbotrain)."""
import importlib.machinery
import importlib.util
import os
import sys


def _turbotrain_doctor_rank():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0" if os.environ.get("{ENV_ROOT}") else ""))
    claimed = os.environ.get("{ENV_CLAIMED}", "").partition(":")[0]
    script = sys.argv[0] if sys.argv else ""
    if os.environ.get("{ENV_FOLDER}") and rank.isdigit() and rank != claimed and script.endswith(".py"):
        from turbotrain.doctor.job.rank_main import from_site

        from_site()


_turbotrain_doctor_rank()
'''


def _rank_from_env() -> int | None:
    for key in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0 if os.environ.get(ENV_ROOT) else None


def from_site() -> None:
    """From ``sitecustomize``: run this process's script as a recorded rank and exit with its code, or return."""
    folder = os.environ.get(ENV_FOLDER)
    rank = _rank_from_env()
    script = sys.argv[0] if sys.argv else ""
    if (
        not folder
        or rank is None
        or os.environ.get(ENV_CLAIMED, "").partition(":")[0] == str(rank)
        or not script.endswith(".py")
        or not os.path.isfile(script)
    ):
        return
    os.environ.pop(ENV_ROOT, None)  # only the first process is the root; the ranks it starts say their number
    os.environ[ENV_CLAIMED] = f"{rank}:{os.getpid()}"  # inherited by DataLoader workers and any other child
    end_rank(run_rank(folder, rank, script, sys.argv[1:]))


def end_rank(code: int) -> None:
    """End this rank's process with ``code``, its output flushed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing left to flush
            pass
    # No interpreter shutdown: the script's process group, DataLoader workers and threads would be torn down
    # one by one, and a peer that already left can make gloo abort there. The rank's work is written.
    os._exit(code)


def run_rank(folder: str, rank: int, script: str, argv: list[str]) -> int:
    """Run ``script`` under the recorder; write ``rank-N.result.json``; the exit code the launcher should see."""
    from ..record.runner import run_script

    return record_rank(
        folder, rank, script, lambda recorder, code, init: run_script(script, argv, recorder, code, init)
    )


def record_rank(
    folder: str,
    rank: int,
    script: str,
    run_under: Callable[[Recorder, Any, Any], ScriptRun],
    world: int | None = None,
) -> int:
    """Run the rank's code (``run_under(recorder, code, init_globals)``: the script, or the function a spawned
    process runs, one of ``world``) under the recorder; write ``rank-N.result.json``; the exit code the launcher
    should see."""
    from ..record.loss_tap import LossTap
    from ..record.memory_limit import memory_limit
    from ..record.recorder import Recorder
    from ..record.recording import to_json

    options = json.loads(os.environ.get(ENV_OPTIONS) or "{}")
    code, init_globals = None, None
    if options.get("change"):  # a job what-if: this rank trains with the fix being timed
        from ..rank_change import RankChange
        from ..apply.change import apply_change

        change = RankChange.from_dict(options["change"])
        apply_change(change)
        if change.branch_every is not None and change.branch_at:
            from ..apply.rarer_branch import TAKE, rarer_branch_code, taking_one_in

            code = rarer_branch_code(script, change.branch_at, change.branch_every)
            init_globals = {TAKE: taking_one_in(change.branch_every)}
    recorder = Recorder(
        measure=int(options.get("steps", 20)),
        warmup=int(options.get("warmup", 3)),
        profile=int(options.get("profile", 2)),
        sees_construction=True,
    )
    # Every rank stops after the same step: one that went on alone would wait at its next collective forever.
    recorder.schedule.extends_for_period = False
    heartbeat = Heartbeat(folder, rank, recorder)
    heartbeat.start()
    tap = LossTap()
    with tap if options.get("losses") else contextlib.nullcontext(), memory_limit(options.get("memory_limit")):
        run = run_under(recorder, code, init_globals)
    heartbeat.stop("failed" if run.failed else "done")
    site = run.error_site
    outcome = {
        "status": run.status,
        "seconds": run.seconds,
        "error": run.error,
        "exit_code": run.exit_code,
        "traceback": run.traceback,
        "where": f"{os.path.basename(site.file)}:{site.line}" if site is not None else None,
    }
    try:
        recording = recorder.recording()
        if world is not None:  # a spawned rank: its index and count are the launcher's, process group or not
            recording = dataclasses.replace(recording, rank=rank, world_size=world)
        recorded = json.loads(to_json(recording))
    except Exception as exc:  # noqa: BLE001 - the rank's outcome still reaches the doctor, with the reason
        recorded = None
        outcome.update(
            status="error", error=f"the doctor could not write this rank's recording: {type(exc).__name__}: {exc}"
        )
    if options.get("losses"):  # doctor --verify compares them between the original and the patch
        try:
            outcome["losses"] = [v.hex() for v in tap.values()]
        except Exception:  # noqa: BLE001 - a device that failed cannot give its losses; the error still goes out
            outcome["losses"] = []
    if options.get("change"):
        from ..apply.change import APPLIED

        outcome["applied"] = dict(APPLIED)
    result = {
        "rank": rank,
        "pid": os.getpid(),
        "node": os.environ.get("GROUP_RANK"),
        "run": outcome,
        "recording": recorded,
    }
    write_json(result_path(folder, rank), result)
    if spans_nodes():
        why = share_result(folder, rank, result)
        if why:
            print(
                f"[rank {rank}] turbotrain doctor: the other nodes' ranks did not reach this node: {why}",
                file=sys.stderr,
            )
    if run.traceback:
        print(f"[rank {rank}] {run.traceback}", file=sys.stderr, end="")
    return (run.exit_code or 1) if run.failed or recorded is None else 0
