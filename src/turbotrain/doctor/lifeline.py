"""The doctor leaves no process and no temporary folder behind, whatever ends it (``kill -9`` included).

While the doctor runs (:func:`guarded` around each entry point), the processes it starts (``--verify``'s runs,
a job's launcher and ranks, fresh-process trials) carry ``TURBOTRAIN_DOCTOR_RUN=<token>`` in their environment
(:func:`mark`), which every process they start inherits, a launcher's ranks in sessions of their own included; its
temporary folders live in a folder of this run (:func:`temp_folder`). A guard process, this file run by path
(standard library only, started on first use, in a session of its own so that a signal to the doctor's group does
not reach it), watches the doctor through a pidfd; when the doctor ends, however, the guard kills every process
that carries the token (a compiler among them once it has ended on its own, or after a grace) and removes the
run's folders, then exits. A run folder whose guard died too (its name
holds the doctor's pid and start time) is removed by the next doctor run that makes one.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import IO, Any, Callable, Iterator

__all__ = ["ENV_MARK", "guarded", "mark", "temp_folder", "remove", "held"]

ENV_MARK = "TURBOTRAIN_DOCTOR_RUN"
_PREFIX = "turbotrain-doctor-run-"
_RUN = re.compile(re.escape(_PREFIX) + r"(\d+)-(\d+)-(\d+)-[0-9a-f]+$")  # pid namespace, pid, start time, random
_KILL_FOR_S = 10.0  # a launcher may start ranks while they are being killed: look again until none is left
# A compiler or linker of the run (torch.compile's C++ build of a kernel) is left to end on its own, for up to this
# long: killed while it writes, it leaves a half-written library in torch's compile cache, which the user's next run
# loads and fails on ("file too short"). A kernel's build takes seconds.
_COMPILE_GRACE_S = 60.0
# Process names (15 characters at most, as /proc/PID/comm holds them) of compilers, assemblers and linkers.
_COMPILERS = frozenset(
    "cc1 cc1plus as ld ld.bfd ld.gold ld.lld lld collect2 gcc g++ cc c++ clang clang++ nvcc ptxas cicc nvlink "
    "fatbinary".split()
)


def _start_time(pid: int | str) -> int | None:
    """The process's start time (clock ticks since boot): with the pid, it names one process for good."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


# -- the doctor's side -----------------------------------------------------------------------------------------


class _Guard:
    """One doctor process's guard: its token, its run folders, and the process that cleans up after it."""

    def __init__(self) -> None:
        self.token = f"{os.getpid()}-{os.urandom(6).hex()}"
        self.folders: dict[str, str] = {}  # temporary root -> this run's folder there
        self.held: dict[str, Any] = {}  # what the run keeps for all its steps (held()), closed at its end
        self._process: subprocess.Popen | None = None
        self._to_guard: IO[bytes] | None = None

    def _tell(self, line: str) -> None:
        try:
            self._start_and_tell(line)
        except OSError:
            pass  # no guard (it could not start, or died): the children's own parent-death signal still holds

    def _start_and_tell(self, line: str) -> None:
        if self._process is None:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), self.token],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a kill of the doctor's process group spares the one that cleans up
            )
            self._to_guard = self._process.stdin
        assert self._to_guard is not None  # stdin=PIPE
        self._to_guard.write(line.encode() + b"\n")
        self._to_guard.flush()

    def mark(self) -> dict[str, str]:
        self._tell("")  # the guard runs before the first process it must end does
        return {ENV_MARK: self.token}

    def folder(self, outside: str | None) -> str:
        """This run's folder in the temporary root, or in another where that root lies inside ``outside``."""
        root = _root(outside)
        if root not in self.folders:
            _sweep(root)
            # A name nobody can make first (the random part), made by this process alone (mkdir, not an existing one).
            name = f"{_PREFIX}{_pid_namespace()}-{os.getpid()}-{_start_time('self') or 0}-{os.urandom(4).hex()}"
            path = os.path.join(root, name)
            self._tell(path)  # before the folder exists: a kill in between leaves nothing unknown to the guard
            os.mkdir(path, 0o700)
            self.folders[root] = path
        return self.folders[root]

    def close(self) -> None:
        for thing in self.held.values():
            thing.close()
        for folder in self.folders.values():
            shutil.rmtree(folder, ignore_errors=True)
        if self._process is None:
            return
        try:
            self._tell("end")  # kill what is left of the run (nothing, normally), remove the folders, exit
            if self._to_guard is not None:
                self._to_guard.close()
            self._process.wait(timeout=_KILL_FOR_S + _COMPILE_GRACE_S + 5)
        except (OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait()


_lock = threading.Lock()
_guard: _Guard | None = None
_depth = 0


@contextmanager
def guarded() -> Iterator[None]:
    """While inside (nested calls share one), :func:`mark` and :func:`temp_folder` are guarded; on leaving the
    outermost, the run's folders are removed and its guard ends. Usable as a decorator."""
    global _guard, _depth
    with _lock:
        _depth += 1
        if _guard is None:
            _guard = _Guard()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            guard, done = _guard, _depth == 0
            if done:
                _guard = None
        if done and guard is not None:
            guard.close()


def mark() -> dict[str, str]:
    """The environment variable that marks a process as this doctor run's (to add to a child's environment);
    empty outside :func:`guarded`."""
    with _lock:
        return _guard.mark() if _guard is not None else {}


def held(key: str, make: Callable[[], Any] | None = None) -> Any | None:
    """What this doctor run keeps for all its steps under ``key`` (a server, say): ``make()`` on first use (without
    ``make``, None until then), its ``close()`` at the run's end; None outside :func:`guarded`."""
    with _lock:
        guard = _guard
    if guard is None:
        return None
    if key not in guard.held and make is not None:
        guard.held[key] = make()
    return guard.held.get(key)


def temp_folder(prefix: str, outside: str | None = None) -> str:
    """A new private folder for temporary files, not inside ``outside`` where another temporary root allows
    (``--verify`` copies that folder: its copy must not land inside itself). Inside :func:`guarded` it lies in
    this run's folder, which the guard removes whatever ends the doctor; the caller removes it with :func:`remove`
    when done."""
    with _lock:
        if _guard is None:
            return tempfile.mkdtemp(prefix=f"turbotrain-{prefix}", dir=_root(outside))
        parent = _guard.folder(outside)
    return tempfile.mkdtemp(prefix=prefix, dir=parent)


def remove(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _root(outside: str | None) -> str:
    """The temporary root, or, where it lies inside ``outside`` (TMPDIR is the script's folder), the first usual
    one that does not."""
    default = tempfile.gettempdir()
    if outside is None or not _inside(default, outside):
        return default
    for candidate in ("/tmp", "/var/tmp", "/dev/shm", os.path.expanduser("~")):
        if os.path.isdir(candidate) and os.access(candidate, os.W_OK) and not _inside(candidate, outside):
            return candidate
    return default  # nowhere else: the copy leaves this run's folder out (fixes/verify.py)


def _sweep(root: str) -> None:
    """Remove the run folders in ``root`` of doctors that are gone (killed with their guard)."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    here = _pid_namespace()
    for name in names:
        found = _RUN.match(name)
        if found is None or int(found[1]) != here or _start_time(found[2]) == int(found[3]):
            continue  # not a run folder, another pid namespace's (its pids mean other processes), or alive
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if info.st_uid == os.getuid() and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


# -- the guard's side (python -I -S lifeline.py DOCTOR_PID TOKEN; lines on stdin: folders, then "end") ----------


def _marked(token: str, spare: set[int]) -> list[int]:
    needle = f"\0{ENV_MARK}={token}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in spare:
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if needle in b"\0" + fh.read():
                        found.append(int(entry))
            except OSError:
                continue  # gone, or not ours to read
    return found


def _compiler(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            name = fh.read().strip()
    except OSError:
        return False
    return name in _COMPILERS or "-linux-" in name  # x86_64-linux-gnu-g++, cut to 15 characters


def _files_written(pid: int) -> list[str]:
    """The regular files ``pid`` holds open for writing."""
    found: list[str] = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            path = os.readlink(f"/proc/{pid}/fd/{fd}")
            with open(f"/proc/{pid}/fdinfo/{fd}") as fh:
                flags = next(int(line.split()[1], 8) for line in fh if line.startswith("flags:"))
        except (OSError, StopIteration, ValueError):
            continue
        if flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR) and os.path.isfile(path):
            found.append(path)
    return found


def _clean_up(token: str, spare: set[int], folders: list[str], compile_grace_s: float = _COMPILE_GRACE_S) -> None:
    """Kill the run's processes, its compilers last (_COMPILE_GRACE_S): one still running after the grace is killed
    and the files it was writing removed. Then remove the run's folders."""
    start = time.monotonic()
    deadline, quiet = start + _KILL_FOR_S, 0
    half_written: set[str] = set()
    while quiet < 2 and time.monotonic() < deadline:
        pids = _marked(token, spare)
        for pid in pids:
            if _compiler(pid):
                if time.monotonic() < start + compile_grace_s:
                    deadline = max(deadline, start + compile_grace_s + 1.0)  # come back to kill it after the grace
                    continue
                half_written.update(_files_written(pid))  # before the kill: its open files go with it
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        quiet = 0 if pids else quiet + 1
        time.sleep(0.02)
    for path in half_written:
        try:
            os.unlink(path)
        except OSError:
            pass
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _watch(doctor: int, token: str) -> None:
    try:
        pidfd: int | None = os.pidfd_open(doctor)
    except (AttributeError, OSError):
        pidfd = None  # no pidfd (Linux before 5.3): the parent's pid is polled instead
    watched = [0] + ([pidfd] if pidfd is not None else [])
    folders: list[str] = []
    ended = dead = False
    pending = b""
    while not ended:
        # The pidfd was opened after the doctor may have died: then this process has another parent already.
        dead = dead or os.getppid() != doctor
        ready = select.select(watched, [], [], 0 if dead else 0.5)[0]
        dead = dead or (pidfd is not None and pidfd in ready)
        if 0 in ready:
            data = os.read(0, 65536)
            if data:
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    if line == b"end":
                        ended = True
                    elif line:
                        folders.append(line.decode())
                continue  # a dead doctor's last words may still be in the pipe: read them all first
            dead = True  # the doctor's end of the pipe closed without an "end": it ended
        if dead:
            break
    _clean_up(token, {os.getpid(), doctor}, folders)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C on the terminal ends the doctor, not its guard
    _watch(int(sys.argv[1]), sys.argv[2])
