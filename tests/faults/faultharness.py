"""The parent's side of the fault tests: start training children, kill them, and keep the figures.

``run_child`` starts one process of a :class:`fault_trainee.Job` and, if asked, signals it
(SIGKILL, or SIGTERM) at a chosen moment: as soon as it starts, or a chosen delay after its
n-th optimizer step. ``kill_campaign`` repeats that with kill moments drawn from a seeded RNG, resumes
after every kill, checks each promise on the way and returns :class:`KillFigures`.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import os
import random
import re
import signal
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

import fault_trainee
from fault_trainee import Job
from turbotrain.train.checkpoint import CheckpointError, list_checkpoints, load_checkpoint

CHILD_TIMEOUT_S = 120.0  # a hang, not a slow machine: children finish in well under a second
SAVE_WINDOW = "checkpoint-between-data-and-commit"
_LEFTOVER = re.compile(r"^(\.step-\d{9}\.(pt|json)\.tmp-\d+|step-\d{9}\.pt)$")

_context: Any = None


def context():
    """The forkserver context; the server preloads what a child needs, once per test session."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["torch", "torch._dynamo", "turbotrain", "turbotrain.train.trainer",
                                         "fault_trainee"])
    return _context


def stop_forkserver() -> None:
    """Stop the session's forkserver and wait for it to exit, so that none outlives the test run (on its own
    it exits only after noticing its parent has gone). CPython has no public call for this; ``_stop`` is the
    one its own tests use.

    The server stops when every copy of its "alive" pipe's write end is closed, and each child it forks gets
    one, which the child's own DataLoader workers inherit. A worker left behind by its training child kept
    the server, and so this call and the whole session, waiting for ever (seen once: a worker of
    test_dead_worker's child, still polling its index queue 15 minutes after that child had exited; PyTorch's
    worker only stops on its parent's death when its parent pid changes, and one forked as its parent dies may
    have recorded pid 1 already). Whatever still holds that write end is a leftover of this session's
    children: it is killed first, and named on stdout."""
    if _context is None:
        return
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_pid is not None:
        pipe = f"pipe:[{os.fstat(server._forkserver_alive_fd).st_ino}]"
        for pid in _writing_to(pipe) - {os.getpid()}:
            print(f"faultharness: killing process {pid}, a leftover of the training children "
                  f"({_command(pid)})")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    server._stop()


def _writing_to(link: str) -> set[int]:
    """The processes holding ``link`` (as /proc/<pid>/fd shows it: ``pipe:[inode]``) open for writing."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") != link:
                    continue
                with open(f"/proc/{entry}/fdinfo/{fd}") as fh:
                    flags = next(int(line.split()[1], 8) for line in fh if line.startswith("flags:"))
            except (OSError, StopIteration):
                continue
            if flags & os.O_ACCMODE == os.O_WRONLY:
                pids.add(int(entry))
                break
    return pids


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return "gone"


@dataclass
class Kill:
    """When to signal the child (SIGKILL unless ``signum`` says otherwise): after its ``after_steps``-th
    optimizer step (None: as soon as it starts), then ``delay_s`` later."""

    after_steps: int | None
    delay_s: float = 0.0
    signum: int = signal.SIGKILL


@dataclass
class ChildRun:
    pid: int
    exitcode: int | None
    resumed_at: int | None = None                 # the step it continued from (None: never reached a batch)
    files_at_resume: list[str] = field(default_factory=list)
    batches: list[tuple[int, list[int]]] = field(default_factory=list)
    stepped: int = 0
    outcome: tuple | None = None                  # ("done", ...), ("preempted", ...), ("error", ...)
    signalled_after: int | None = None            # steps it had reported when the signal was sent
    workers: dict[int, int] = field(default_factory=dict)  # DataLoader worker id -> pid (the latest)
    seconds: float = 0.0

    @property
    def completed(self) -> int:
        """Optimizer steps done in total, counting the steps this process trained (lost or not)."""
        return (self.resumed_at or 0) + self.stepped


class Child:
    """One training process and the pipe it reports on."""

    def __init__(self, job: Job):
        ctx = context()
        self.conn, child_end = ctx.Pipe()
        # Not a daemon: daemonic processes may not start DataLoader workers.
        self.proc = ctx.Process(target=fault_trainee.run_job, args=(child_end, job))
        self.started = time.monotonic()
        self.proc.start()
        child_end.close()
        self.run = ChildRun(pid=self.proc.pid, exitcode=None)

    def _record(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "resumed":
            self.run.resumed_at, self.run.files_at_resume = msg[1], msg[2]
        elif kind == "batch":
            self.run.batches.append((msg[1], msg[2]))
        elif kind == "stepped":
            self.run.stepped = msg[1]
        elif kind == "worker":
            self.run.workers[msg[1]] = msg[2]
        elif kind in ("done", "preempted", "error"):
            self.run.outcome = msg

    def messages(self, timeout_s: float = CHILD_TIMEOUT_S):
        """Yield each message as it arrives (recorded first), until the child exits."""
        deadline = time.monotonic() + timeout_s
        while True:
            ready = multiprocessing.connection.wait([self.conn, self.proc.sentinel],
                                                    timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                self.proc.kill()
                raise AssertionError(f"training child {self.proc.pid} hung for {timeout_s:.0f} s")
            if self.conn in ready:
                try:
                    msg = self.conn.recv()
                except EOFError:
                    break
                self._record(msg)
                yield msg
            elif not self.conn.poll(0):
                break  # exited, and everything it sent has been read

    def finish(self) -> ChildRun:
        """Wait for the exit; read what it sent before dying (DataLoader workers may still hold the pipe)."""
        for _ in self.messages():
            pass
        self.proc.join(CHILD_TIMEOUT_S)
        while self.conn.poll(0):
            try:
                self._record(self.conn.recv())
            except EOFError:
                break
        self.conn.close()
        self.run.exitcode = self.proc.exitcode
        self.run.seconds = time.monotonic() - self.started
        return self.run

    def signal(self, signum: int) -> None:
        self.run.signalled_after = self.run.stepped
        os.kill(self.proc.pid, signum)


def run_child(job: Job, kill: Kill | None = None) -> ChildRun:
    """Run one process of ``job`` to its end, or until ``kill`` says to signal it."""
    child = Child(job)
    try:
        if kill is not None:
            for msg in child.messages():
                due = msg[0] == "begin" if kill.after_steps is None else msg == ("stepped", kill.after_steps)
                if due:
                    if kill.delay_s:
                        time.sleep(kill.delay_s)
                    child.signal(kill.signum)
                    break
        return child.finish()
    finally:
        if child.proc.exitcode is None:  # the test failed while the child ran: do not leave it behind
            child.proc.kill()
            child.proc.join()


# -- what is on disk ---------------------------------------------------------------------------

def leftovers(directory: str | Path) -> set[str]:
    """turbotrain's temporary files, and checkpoint data without its manifest (never committed)."""
    directory = Path(directory)
    if not directory.is_dir():
        return set()
    names = {p.name for p in directory.iterdir()}
    return {n for n in names if _LEFTOVER.match(n) and not (n.endswith(".pt") and n[:-3] + ".json" in names)}


def committed(directory: str | Path) -> list[Path]:
    """Checkpoints whose manifest (the commit) exists, oldest first."""
    return [p for p in list_checkpoints(directory) if p.with_suffix(".json").exists()]


def unloadable(directory: str | Path) -> list[str]:
    """Committed checkpoints that do not load: the promise is that there are none."""
    bad = []
    for path in committed(directory):
        try:
            load_checkpoint(path)
        except CheckpointError as exc:
            bad.append(str(exc))
    return bad


def newest_step(directory: str | Path) -> int:
    found = committed(directory)
    return int(found[-1].stem.split("-")[1]) if found else 0


# -- comparing runs ----------------------------------------------------------------------------

def assert_same(a: Any, b: Any, where: str = "checkpoint") -> None:
    """Bitwise equality of two (nested) checkpoint states."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_final_state(dir_a: str | Path, dir_b: str | Path) -> int:
    """The newest checkpoints of two runs hold the same weights, optimizer, schedule, position and RNGs."""
    a, b = load_checkpoint(committed(dir_a)[-1]), load_checkpoint(committed(dir_b)[-1])
    for key in ("step", "model", "optimizers", "schedulers", "position", "runtime"):
        assert_same(a[key], b[key], key)
    assert a["trainer"]["samples"] == b["trainer"]["samples"]
    return a["step"]


class SampleLog:
    """The samples each optimizer step trained on, as they stand after every resume."""

    def __init__(self):
        self.by_step: dict[int, list[int]] = {}

    def add(self, run: ChildRun) -> None:
        if run.resumed_at is None:
            return
        # Steps at or after the resume point were lost with the kill and are trained again.
        self.by_step = {s: idx for s, idx in self.by_step.items() if s < run.resumed_at}
        for step, indices in run.batches:
            self.by_step.setdefault(step, []).extend(indices)

    def order(self, steps: int) -> list[int]:
        return [i for s in range(steps) for i in self.by_step.get(s, [])]


def assert_epochs_are_permutations(order: list[int], samples: int) -> None:
    """Every full epoch sees each sample exactly once: no repeats, no gaps."""
    for start in range(0, len(order) - samples + 1, samples):
        assert sorted(order[start:start + samples]) == list(range(samples)), f"epoch starting at sample {start}"


# -- the campaign --------------------------------------------------------------------------------

@dataclass
class KillFigures:
    kills: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    restarts: int = 0                       # one after every kill
    restarts_resumed: int = 0               # resumed from the newest complete checkpoint and trained on
    restarts_from_scratch: int = 0          # no checkpoint was committed yet
    restarts_killed_while_starting: int = 0  # killed again before their first step (start-up kills)
    resumed_mid_epoch: int = 0
    resumed_at_epoch_boundary: int = 0
    unloadable_checkpoints: int = 0         # committed checkpoints that would not load (target 0)
    steps_lost: list[int] = field(default_factory=list)
    kills_leaving_files: int = 0            # kills that left temporary or uncommitted files behind
    files_left: int = 0
    files_not_cleaned: int = 0              # of those, still there once the next process resumed (target 0)
    final_step: int = 0
    bitwise_equal_to_uninterrupted: bool = False
    same_sample_order: bool = False
    processes: int = 0
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        lost = self.steps_lost
        out = asdict(self)
        out["steps_lost"] = {"max": max(lost), "mean": round(statistics.mean(lost), 2),
                             "histogram": {str(k): lost.count(k) for k in sorted(set(lost))}}
        return out

    def to_json(self) -> str:
        return json.dumps(self.summary(), indent=2)


def kill_campaign(root: Path, kills: int, seed: int, job: Job) -> KillFigures:
    """Kill a real training run ``kills`` times at moments drawn from ``seed``, resuming after each.

    Kinds of kill: at start-up (while it cleans up and resumes), inside the save window
    through the named fault point (data written, manifest not), and after n optimizer steps
    plus a random delay (mid-step, in a save, between steps). Asserts every promise as it
    goes; returns the figures.
    """
    started = time.monotonic()
    rng = random.Random(seed)
    k, epoch_steps = job.checkpoint_every, job.samples // job.batch_size
    reference = replace(job, directory=str(root / "uninterrupted"))
    ref_run = run_child(reference)
    assert ref_run.outcome and ref_run.outcome[0] == "done", ref_run.outcome
    ref_log = SampleLog()
    ref_log.add(ref_run)

    job = replace(job, directory=str(root / "killed"))
    figures, log = KillFigures(), SampleLog()
    expected_resume, pending_lost = 0, None
    while True:
        final = figures.kills == kills
        left = leftovers(job.directory)
        draw = rng.random()
        if final:
            kind, kill, this = "none", None, job
        elif draw < 0.15:
            kind, kill, this = "start-up", Kill(None, rng.uniform(0.0, 0.05)), job
        elif draw < 0.35:
            kind, kill, this = "save window (fault point)", None, replace(job, fault=SAVE_WINDOW)
        else:
            kind, kill, this = "after a step", Kill(rng.randint(1, 2 * k), rng.uniform(0.0, 0.004)), job
        run = run_child(this, kill)
        figures.processes += 1
        restart = figures.processes > 1
        figures.restarts += restart
        if run.resumed_at is None:
            figures.restarts_killed_while_starting += restart
        else:
            # It resumed from the newest complete checkpoint, after cleaning up what the kill left.
            assert run.resumed_at == expected_resume, (run.resumed_at, expected_resume)
            not_cleaned = left & set(run.files_at_resume)
            figures.files_not_cleaned += len(not_cleaned)
            if restart and not expected_resume:
                figures.restarts_from_scratch += 1
            elif restart:
                figures.restarts_resumed += 1
                if expected_resume % epoch_steps:
                    figures.resumed_mid_epoch += 1
                else:
                    figures.resumed_at_epoch_boundary += 1
        if pending_lost is not None and run.resumed_at is not None:
            figures.steps_lost.append(pending_lost - run.resumed_at)
            pending_lost = None
        log.add(run)
        if final:
            assert run.outcome and run.outcome[0] == "done" and run.exitcode == 0, (run.outcome, run.exitcode)
            break
        assert run.exitcode == -signal.SIGKILL, f"{kind}: expected a kill, got exit {run.exitcode} {run.outcome}"
        figures.kills += 1
        figures.kinds[kind] = figures.kinds.get(kind, 0) + 1
        if kind.startswith("save window"):
            # Died between the data and the commit: the data is there, uncommitted.
            assert any(n.endswith(".pt") for n in leftovers(job.directory)), sorted(os.listdir(job.directory))
        now_left = leftovers(job.directory)
        figures.kills_leaving_files += bool(now_left - left)
        figures.files_left += len(now_left - left)
        bad = unloadable(job.directory)
        figures.unloadable_checkpoints += len(bad)
        assert not bad, bad
        if run.resumed_at is not None:
            pending_lost = max(pending_lost or 0, run.completed)
        expected_resume = newest_step(job.directory)
        if pending_lost is not None:
            assert pending_lost - expected_resume <= k, (pending_lost, expected_resume, k)
    figures.final_step = assert_same_final_state(reference.directory, job.directory)
    figures.bitwise_equal_to_uninterrupted = True
    assert log.order(figures.final_step) == ref_log.order(figures.final_step)
    assert_epochs_are_permutations(log.order(figures.final_step), job.samples)
    figures.same_sample_order = True
    figures.wall_s = round(time.monotonic() - started, 1)
    return figures
