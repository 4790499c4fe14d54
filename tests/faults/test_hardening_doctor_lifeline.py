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
        _wait_gone(int(child), Path(folder), 5)
        assert not _alive(int(child)) and not Path(folder).exists()
        assert list(tmp_path.iterdir()) == []  # the run's folder too
    finally:
        _end(doctor, int(child))


def _wait_gone(child: int, folder: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (_alive(child) or folder.exists()) and time.monotonic() < deadline:
        time.sleep(0.05)


def _end(doctor: subprocess.Popen, child: int) -> None:
    if _alive(child):
        os.kill(child, signal.SIGKILL)
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


# A stand-in for a linker the run started (torch.compile builds a kernel's library with the system's C++ compiler):
# named "ld" as the kernel shows it, it writes the first half of its output, says so, and the rest a while later.
LINKER = """import sys, time
open("/proc/self/comm", "w").write("ld")
out = open(sys.argv[1], "wb")
out.write(b"first half,")
out.flush()
print("writing", flush=True)
time.sleep(float(sys.argv[2]))
out.write(b" second half")
out.close()
"""
WHOLE = b"first half, second half"


def test_a_killed_doctors_linker_is_left_to_finish_the_library_it_writes(tmp_path):
    """Killed mid-write, a linker leaves a half library in torch's compile cache, and the user's next run fails
    loading it ("file too short"): the guard kills the run's other processes at once and lets a compiler end."""
    output = tmp_path / "kernel.so"
    doctor_code = DOCTOR.replace(
        'child = subprocess.Popen(["sleep", "60"], env={"PATH": "/usr/bin:/bin", **lifeline.mark()})',
        'child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], "1.5"], stdout=subprocess.PIPE, '
        'text=True, env={"PATH": "/usr/bin:/bin", **lifeline.mark()})\n'
        '    assert child.stdout.readline() == "writing\\n"',
    )
    assert doctor_code != DOCTOR
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    doctor = subprocess.Popen([sys.executable, "-c", doctor_code, LINKER, str(output)], env=env,
                              stdout=subprocess.PIPE, text=True)
    folder, child = doctor.stdout.readline().split()
    try:
        assert output.read_bytes() == b"first half,"
        doctor.send_signal(signal.SIGKILL)
        doctor.wait()
        time.sleep(0.5)
        assert _alive(int(child)), "the linker was killed with the doctor"
        _wait_gone(int(child), Path(folder), 10)
        assert not _alive(int(child)) and not Path(folder).exists()
        assert output.read_bytes() == WHOLE
    finally:
        _end(doctor, int(child))


def test_a_linker_past_the_grace_is_killed_and_its_half_written_output_removed(tmp_path):
    token = "test-" + os.urandom(4).hex()
    written, read = tmp_path / "kernel.so", tmp_path / "kernel.o"
    read.write_bytes(b"an input it reads")
    env = {"PATH": "/usr/bin:/bin", lifeline.ENV_MARK: token}
    code = LINKER.replace('out.write(b"first half,")', 'out.write(b"first half,"); source = open(sys.argv[3], "rb")')
    linker = subprocess.Popen([sys.executable, "-c", code, str(written), "60", str(read)], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert linker.stdout.readline() == "writing\n"
        started = time.monotonic()
        lifeline._clean_up(token, {os.getpid()}, [], compile_grace_s=0.5)
        assert time.monotonic() - started < 5
        assert linker.wait(timeout=5) == -signal.SIGKILL
        assert not written.exists() and read.read_bytes() == b"an input it reads"
    finally:
        linker.kill()
        linker.wait()
        linker.stdout.close()
