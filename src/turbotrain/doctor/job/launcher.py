"""Recording a multi-process job: start the user's launcher with every rank under the recorder, watch the
ranks' progress, gather each rank's ``Recording``, and end the whole job when a rank crashes or hangs.

The launcher is any command (``torchrun ...``, ``turbotrain launch ...``): the ranks record themselves through
a ``sitecustomize`` the doctor writes into the job's folder (:mod:`.rank_main`). The launcher runs in a session
of its own; torchrun starts each rank in yet another, so ending the job signals the launcher's group and every
rank's (the ranks say their pid in their status files), SIGTERM first, SIGKILL after a grace period.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .. import lifeline
from .forked_launch import ForkedLauncher, own_launch_argv, start_launcher
from ..rank_change import RankChange
from .rank_main import ENV_CLAIMED, ENV_FOLDER, ENV_OPTIONS, ENV_ROOT, SITECUSTOMIZE
from .rank_status import read_json, result_path
from ..record.memory_limit import active as active_memory_limit
from ..record.recording import Recording, from_json
from .warm_ranks import WarmRanks

__all__ = ["RankOutcome", "JobRun", "run_job", "script_is_launcher"]

_SRC = Path(__file__).resolve().parents[3]  # the folder holding the turbotrain package the ranks import
FAILED_RANK_GRACE_S = 15.0  # a launcher that does not end the job by itself after a rank failed
TERM_GRACE_S = 5.0  # SIGTERM, then SIGKILL
START_S = 120.0  # the ranks' set-up may take longer than a step (imports, rendezvous, data)


@dataclass
class RankOutcome:
    rank: int
    recording: Recording | None = None
    run: dict[str, Any] | None = None  # how the rank's script ended (status, error, where, traceback)
    status: dict[str, Any] | None = None  # its last heartbeat (step, doing, where, pid, host, time)
    node: str | None = None  # torchrun's node (GROUP_RANK) on a job over several nodes

    @property
    def failed(self) -> bool:
        return self.run is not None and self.run.get("status") in ("error", "exit")

    def doing(self) -> str:
        """``at step 5, waiting for data (DataLoader) at train.py:30``."""
        s = self.status or {}
        parts = [f"at step {s['step']}" if s.get("step") is not None else "before its first step"]
        if s.get("doing"):
            parts.append(str(s["doing"]))
        if s.get("where"):
            parts.append(f"at {s['where']}")
        return ", ".join(parts)

    def name(self) -> str:
        s = self.status or {}
        extra = ", ".join(str(x) for x in (s.get("host"), f"pid {s['pid']}" if s.get("pid") else None) if x)
        return f"rank {self.rank}" + (f" ({extra})" if extra else "")


@dataclass
class JobRun:
    command: list[str]
    returncode: int | None
    seconds: float
    ranks: list[RankOutcome]
    failure: str | None = None  # why the job ended badly: which rank, what it was doing
    hung: bool = False
    left_behind: list[int] = field(default_factory=list)  # pids still alive after the clean-up (none expected)

    @property
    def nodes(self) -> int:
        return len({r.node for r in self.ranks if r.node is not None}) or 1

    @property
    def recordings(self) -> list[Recording]:
        return [r.recording for r in sorted(self.ranks, key=lambda r: r.rank) if r.recording is not None]


def run_job(
    command: list[str],
    steps: int,
    warmup: int,
    profile: int,
    hang_timeout_s: float = 120.0,
    stdout: IO[str] | int | None = None,
    stderr: IO[str] | int | None = None,
    poll_s: float = 0.2,
    change: RankChange | None = None,
    cwd: str | os.PathLike | None = None,
    losses: bool = False,
    warm: bool = False,
) -> JobRun:
    """Run ``command`` (a launcher and its arguments) with every rank recorded; always leaves no process.
    ``change``: a fix every rank applies before its script starts (the job what-ifs); ``losses``: each rank's
    result carries the losses its backward passes took (``run["losses"]``, float.hex); ``warm``: the ranks of a
    job the doctor launches itself start from the doctor run's warm-rank server (:mod:`.warm_ranks`), for runs
    that repeat the job (what-ifs, ``--verify``): the server's start costs what one cold start does."""
    folder = Path(lifeline.temp_folder("job-"))
    env = {**os.environ, **lifeline.mark()}  # the launcher and every rank end with the doctor, however it ends
    env.pop(ENV_CLAIMED, None)
    env.pop(ENV_ROOT, None)
    if script_is_launcher(command):
        env[ENV_ROOT] = "1"
    env[ENV_FOLDER] = str(folder)
    # torchrun's per-launch log folder inside the job's, which goes with it (torchrun's own is left in TMPDIR).
    env.setdefault("PET_LOG_DIR", str(folder / "torchrun-logs"))
    options: dict[str, Any] = {"steps": steps, "warmup": warmup, "profile": profile}
    if change is not None:
        options["change"] = change.to_dict()
    if losses:
        options["losses"] = True
    limit = active_memory_limit()
    if limit is not None:  # every rank runs under the doctor's --memory-limit
        options["memory_limit"] = limit.limit_bytes
    env[ENV_OPTIONS] = json.dumps(options)
    site = folder / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), str(_SRC), env.get("PYTHONPATH")]))
    server = _warm_ranks() if warm and own_launch_argv(command) is not None and "PYTHON_EXEC" not in env else None
    if server is not None:
        env.update(server.env())
    started = time.monotonic()
    try:
        proc = start_launcher(command, env, cwd, stdout, stderr)
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        return JobRun(command, None, 0.0, [], failure=f"could not start {command[0]!r}: {exc}")
    hung = stalled = False
    try:
        last, progress_at, failed_at = None, time.monotonic(), None
        while proc.poll() is None:
            statuses = _statuses(folder)
            progress = sorted((rank, s.get("step"), s.get("state")) for rank, s in statuses.items())
            now = time.monotonic()
            if progress != last:
                last, progress_at = progress, now
            if failed_at is None and any(s.get("state") == "failed" for s in statuses.values()):
                failed_at = now
            if failed_at is not None and now - failed_at > FAILED_RANK_GRACE_S:
                stalled = True  # a rank failed and the launcher kept the others waiting
                break
            # Until every rank has closed a step, set-up (imports, rendezvous, loading data) may take longer.
            stepping = bool(statuses) and all((st.get("step") or 0) > 0 for st in statuses.values())
            if now - progress_at > (hang_timeout_s if stepping else max(hang_timeout_s, START_S)):
                hung = True
                break
            time.sleep(poll_s)
        if not (hung or stalled):
            _let_ranks_finish(folder, poll_s)
    finally:
        pids = [int(s["pid"]) for s in _statuses(folder).values() if s.get("pid")]
        left = _stop(proc, pids, folder)
    outcomes = _outcomes(folder)
    shutil.rmtree(folder, ignore_errors=True)
    job = JobRun(command, proc.returncode, time.monotonic() - started, outcomes, hung=hung, left_behind=left)
    job.failure = _failure(job, hang_timeout_s, stalled)
    return job


def _warm_ranks() -> WarmRanks | None:
    """The doctor run's warm-rank server (job/warm_ranks.py), started by the first run that repeats a job; None
    outside a doctor run. It has the environment every launcher of this doctor run starts with, less what differs
    per run."""
    env = {**os.environ, **lifeline.mark()}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_SRC), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun gives the ranks of a job of several
    for key in (ENV_CLAIMED, ENV_ROOT, ENV_FOLDER, ENV_OPTIONS):
        env.pop(key, None)
    return lifeline.held("warm-ranks", lambda: WarmRanks(env, lifeline.temp_folder("warm-ranks-")))


def _let_ranks_finish(folder: Path, poll_s: float) -> None:
    """The launcher ended; ranks it did not wait for (a script that started its own ranks and returned first)
    get a grace period to write their recordings before they are stopped."""
    deadline = time.monotonic() + FAILED_RANK_GRACE_S
    while time.monotonic() < deadline:
        statuses = _statuses(folder)
        running = [r for r in statuses if not result_path(folder, r).exists()]
        if not any(_ours(int(statuses[r].get("pid") or 0), folder) for r in running):
            return
        time.sleep(poll_s)


def script_is_launcher(command: list[str]) -> bool:
    """``python train.py ...``: the script is its own launcher (Lightning's DDP starts the other ranks from
    it), so its first process is rank 0."""
    first = os.path.basename(command[0]) if command else ""
    python = first == os.path.basename(sys.executable) or re.fullmatch(r"python[0-9.]*", first) is not None
    return python and len(command) > 1 and command[1].endswith(".py")


# -- reading the folder --------------------------------------------------------------------------------


def _statuses(folder: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for path in folder.glob("rank-*.status.json"):
        data = read_json(path)
        if data is not None:
            out[int(data["rank"])] = data
    return out


def _outcomes(folder: Path) -> list[RankOutcome]:
    outcomes = {rank: RankOutcome(rank, status=status) for rank, status in _statuses(folder).items()}
    for path in folder.glob("rank-*.result.json"):
        data = read_json(path)
        if data is None:
            continue
        outcome = outcomes.setdefault(int(data["rank"]), RankOutcome(int(data["rank"])))
        outcome.run = data.get("run")
        outcome.node = data.get("node")
        outcome.recording = from_json(json.dumps(data["recording"])) if data.get("recording") else None
    return sorted(outcomes.values(), key=lambda o: o.rank)


# -- what went wrong, in words ---------------------------------------------------------------------


def _failure(job: JobRun, hang_timeout_s: float, stalled: bool) -> str | None:
    ranks = job.ranks
    if job.hung:
        if not ranks:
            return (
                f"No rank started within {max(hang_timeout_s, START_S):.0f} s; the job was stopped. Is the "
                "command a launcher "
                "that starts Python ranks with RANK or LOCAL_RANK set (torchrun, turbotrain launch)?"
            )
        lowest = min((r.status or {}).get("step", 0) for r in ranks)
        behind = [r for r in ranks if (r.status or {}).get("step", 0) == lowest and r.run is None]
        # A rank waiting in an all-reduce waits for another: the stuck ones are those that are not.
        behind = [r for r in behind if not _in_collective(r)] or behind
        stuck = "; ".join(f"{r.name()} {r.doing()}" for r in behind) or "no rank"
        others = [r for r in ranks if r not in behind]
        text = f"The job made no progress for {hang_timeout_s:.0f} s and was stopped. Stuck: {stuck}."
        if others:
            text += " The others: " + "; ".join(f"{r.name()} {r.doing()}" for r in others) + "."
        return text
    # A rank whose collective broke because a peer vanished is a casualty, not the cause: a killed rank
    # leaves no error of its own, so it is named before the ranks that lost their connection to it.
    failed = [r for r in ranks if r.failed and not (_lost_a_peer(r) and any(g.run is None for g in ranks))]
    if failed:
        first = failed[0]
        run = first.run or {}
        where = f" at {run['where']}" if run.get("where") else ""
        text = f"{first.name()} failed {first.doing().split(', ')[0]}{where}: {run.get('error')}. The job was ended."
        if stalled:
            text += " (The launcher kept the other ranks waiting; the doctor ended them.)"
        return text
    gone = [r for r in ranks if r.run is None]
    casualties = [r for r in ranks if r.failed and r not in gone]
    if job.returncode not in (0, None) or gone:
        if not ranks:
            return f"The launcher exited with code {job.returncode} before any rank started: {' '.join(job.command)}"
        # The first rank to stop writing its status is the one that died; the launcher then ended the others.
        gone.sort(key=lambda r: (r.status or {}).get("time", 0.0))
        if gone:
            first, rest = gone[0], gone[1:]
            text = (
                f"{first.name()} ended without finishing (killed or crashed), {first.doing()}. "
                f"The launcher exited with code {job.returncode}."
            )
            if rest:
                text += " Ended with it: " + "; ".join(f"{r.name()} {r.doing()}" for r in rest) + "."
            if casualties:
                text += (
                    " Lost the connection to it: "
                    + "; ".join(f"{r.name()} ({(r.run or {}).get('error')})" for r in casualties)
                    + "."
                )
            limit = active_memory_limit()
            if limit is not None and limit.device == "cpu":
                text += (
                    f" It ran under --memory-limit {limit.limit_bytes / 2**20:.0f}MiB: on the CPU each thread a rank "
                    "starts (its process group's among them) takes its stack from the limit, and a rank that cannot "
                    "start one is ended by the C library without an error: give a larger limit."
                )
            return text
        return f"The launcher exited with code {job.returncode} after every rank finished."
    return None


# How gloo and NCCL word an error raised on a rank whose peer has gone (killed, crashed, unreachable).
_PEER_LOST = re.compile(
    r"connection (reset|closed) by peer|broken pipe|remote process exited|communicator was aborted"
    r"|DistNetworkError|socket closed|connection refused",
    re.IGNORECASE,
)


def _lost_a_peer(rank: RankOutcome) -> bool:
    return bool(_PEER_LOST.search(str((rank.run or {}).get("error") or "")))


def _in_collective(rank: RankOutcome) -> bool:
    doing = str((rank.status or {}).get("doing") or "")
    return "all-reduce" in doing or "torch.distributed." in doing


# -- ending every process ------------------------------------------------------------------------------


def _ours(pid: int, folder: Path) -> bool:
    """``pid`` is still one of this job's ranks (not a recycled pid): its environment says the job's folder, or it
    is a warm rank (which the kernel shows with its server's environment), the job's as the runs are one at a time."""
    try:
        if f"{ENV_FOLDER}={folder}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
            return True
    except OSError:
        return False
    warm = lifeline.held("warm-ranks")
    return warm is not None and warm.forked(pid)


def _signal(pid: int, sig: int, group: bool) -> None:
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(proc: subprocess.Popen | ForkedLauncher, pids: list[int], folder: Path) -> list[int]:
    """End the launcher's session and every rank (and the rank's own process group); the pids left alive."""
    for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 2.0)):
        ranks = [pid for pid in pids if _ours(pid, folder)]
        if proc.poll() is None:
            _signal(proc.pid, sig, group=True)
        elif not ranks:
            break
        for pid in ranks:
            try:
                own_group = os.getpgid(pid) == pid
            except ProcessLookupError:
                continue
            _signal(pid, sig, group=own_group)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (proc.poll() is None or any(_ours(p, folder) for p in pids)):
            time.sleep(0.05)
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        pass
    return [pid for pid in pids if _ours(pid, folder)] + ([proc.pid] if proc.poll() is None else [])
