"""The doctor's guard (doctor/lifeline.py, issue 43 item 8) on its own, without torch: what a killed doctor started
is killed and its folders removed at once; a dead doctor's run folder is swept by the next run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from turbotrain.doctor import lifeline

LIFELINE = Path(lifeline.__file__)
# A stand-in for the doctor: lifeline.py loaded by path (no torch), a marked child that would sleep for a minute,
# a folder of the run; then it waits to be killed.
DOCTOR = f"""import importlib.util, subprocess, sys, time
spec = importlib.util.spec_from_file_location("lifeline", {str(LIFELINE)!r})
lifeline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lifeline)
with lifeline.guarded():
    folder = lifeline.temp_folder("verify-")
    child = subprocess.Popen(["sleep", "60"], env={{"PATH": "/usr/bin:/bin", **lifeline.mark()}})
    print(folder, child.pid, flush=True)
    time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_what_a_killed_doctor_started_is_killed_and_its_folder_removed(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    doctor = subprocess.Popen([sys.executable, "-c", DOCTOR], env=env, stdout=subprocess.PIPE, text=True)
    folder, child = doctor.stdout.readline().split()
    try:
        assert Path(folder).is_dir() and _alive(int(child))
        doctor.send_signal(signal.SIGKILL)
        doctor.wait()
        deadline = time.monotonic() + 5
        while (_alive(int(child)) or Path(folder).exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(int(child)) and not Path(folder).exists()
        assert list(tmp_path.iterdir()) == []  # the run's folder too
    finally:
        if _alive(int(child)):
            os.kill(int(child), signal.SIGKILL)
        doctor.kill()
        doctor.wait()
        doctor.stdout.close()


def test_a_dead_doctors_run_folder_is_swept_and_the_guard_ends_with_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    namespace = os.stat("/proc/self/ns/pid").st_ino
    gone = subprocess.Popen(["true"])
    gone.wait()
    parent = os.getppid()
    started = Path(f"/proc/{parent}/stat").read_text().rpartition(")")[2].split()[19]
    dead = tmp_path / f"turbotrain-doctor-run-{namespace}-{gone.pid}-1-5eed"
    (dead / "verify-abc" / "original").mkdir(parents=True)
    alive = tmp_path / f"turbotrain-doctor-run-{namespace}-{parent}-{started}-5eed"  # a doctor still running
    elsewhere = tmp_path / f"turbotrain-doctor-run-{namespace + 1}-{gone.pid}-1-5eed"  # another pid namespace's
    alive.mkdir()
    elsewhere.mkdir()
    before = set(_children())  # the session's own servers (nginx, a forkserver) may be children already
    with lifeline.guarded():
        made = lifeline.temp_folder("verify-")
        assert Path(made).is_dir() and not dead.exists()
    assert alive.is_dir() and elsewhere.is_dir() and not Path(made).exists()
    assert set(_children()) <= before  # the guard ended with the run


def _children() -> list[int]:
    """This process's live children."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if entry.name.isdigit() and int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.append(int(entry.name))
    return found
