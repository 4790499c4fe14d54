"""``kill -9`` of the doctor (issue 43, item 8): during ``--verify`` and during a two-rank job, at seeded random
points, it leaves no process and no temporary folder behind.

Every process of a run carries ``TT_HARDENING_KILL=<token>`` in its environment (set on the doctor, inherited by
all it starts, the ranks in their own sessions too), so what is left is found in /proc whoever its parent is."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK = "TT_HARDENING_KILL"
# Slow where the doctor is killed (in --verify's copy of the folder, on the job's ranks), so that what the kill
# leaves would still be running when the test looks: 2 s a step, 12 s and more for the doctor's window.
SINGLE = """import os
import time
import torch
SLOW = os.path.dirname(os.path.abspath(__file__)) != os.environ["TT_HARDENING_HOME"]
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1000):
    loss = model(torch.randn(8, 8)).pow(2).mean()
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
    time.sleep(2.0 if SLOW else 0.0)
"""
RANKS = """import time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1000):
    loss = model(torch.randn(8, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(2.0)
"""
FAST = ["--steps", "3", "--warmup", "1", "--no-what-if", "--watch", "0"]
RNG = random.Random(43)
# (what runs when the doctor is killed, seconds after it started that): three seeded points, as each costs a
# doctor run up to its children (6-7 s on a 2-core machine, 7-10 s when it is busy); the delay lands in the
# children's start-up, their imports, or their steps.
POINTS = [(kind, round(RNG.uniform(0.0, 1.5), 2)) for kind in ("verify", "job", "verify")]


def _processes(token: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment carries this run's mark."""
    found, needle = [], f"\0{MARK}={token}\0".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in b"\0" + environ and state != "Z":
            found.append((int(entry), cmdline))
    return found


def _started(kind: str, processes: list[tuple[int, str]]) -> bool:
    if kind == "verify":
        return any("turbotrain.doctor.fixes.child" in cmd for _, cmd in processes)
    return sum("ranks.py" in cmd and "turbotrain" not in cmd for _, cmd in processes) >= 2


@pytest.mark.parametrize("kind, delay", POINTS)
def test_a_killed_doctor_leaves_no_process_and_no_copy(tmp_path, kind, delay):
    pytest.importorskip("libcst", reason="doctor --fix needs libcst")
    work, temp = tmp_path / "work", tmp_path / "tmp"
    work.mkdir()
    temp.mkdir()
    (work / "single.py").write_text(SINGLE)
    (work / "ranks.py").write_text(RANKS)
    if kind == "verify":
        args = [*FAST, "--fix", "p.patch", "--verify", "--verify-rounds", "1", "--fix-only", "zero-grad-not-none",
                "single.py"]
    else:
        args = [*FAST, "--nproc-per-node", "2", "ranks.py"]
    token = uuid.uuid4().hex
    env = {**os.environ, MARK: token, "TMPDIR": str(temp), "OMP_NUM_THREADS": "1", "TT_HARDENING_HOME": str(work),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    doctor = subprocess.Popen([sys.executable, "-m", "turbotrain", "doctor", *args], cwd=work, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _started(kind, _processes(token)):
            assert doctor.poll() is None, f"the doctor ended (exit {doctor.returncode}) before its {kind} started"
            assert time.monotonic() < deadline, f"no {kind} within 60 s"
            time.sleep(0.05)
        time.sleep(delay)
        assert doctor.poll() is None, "the doctor ended before it could be killed"
        doctor.send_signal(signal.SIGKILL)
        doctor.wait()
        deadline = time.monotonic() + 5
        while _processes(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _processes(token)
    finally:
        for pid, _ in _processes(token):  # the test stops what it started, whatever the outcome
            os.kill(pid, signal.SIGKILL)
        doctor.kill()
        doctor.wait()
    assert left == []
    # torch keeps folders of its own there after any run, killed or not (torchrun's logs, inductor's cache).
    theirs = ("torchelastic_", "torchinductor_")
    assert [p.name for p in temp.iterdir() if p.is_dir() and not p.name.startswith(theirs)] == []
    assert sorted(p.name for p in work.iterdir()) == ["ranks.py", "single.py"]
