"""The doctor forks its own ``turbotrain launch`` (torch is imported already) where it runs no other thread; the
ranks torchrun starts are still fresh interpreters, and the launcher's exit code reaches the doctor. With a
thread running, or for another launcher, the launcher is a new process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from turbotrain.doctor.job.forked_launch import own_launch_argv

pytestmark = pytest.mark.reads_no_time  # its assertions read no time: the shared lane

# Run in a process of its own: pytest's process (and an xdist worker's) may run threads of its own.
PROBE = textwrap.dedent("""\
    import json, os, sys, threading, time
    import torch  # as in the doctor: torch is imported before the launcher starts
    from turbotrain.doctor.job.forked_launch import start_launcher

    rank_script, out, exit_code, with_thread = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    if with_thread:
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    command = [sys.executable, "-m", "turbotrain", "launch", "--nproc-per-node", "1", rank_script, out, exit_code]
    proc = start_launcher(command, dict(os.environ), None, None, None)
    print(json.dumps({"kind": type(proc).__name__, "pid": proc.pid, "code": proc.wait(timeout=120),
                      "parent": os.getpid()}))
""")

RANK = textwrap.dedent("""\
    import json, os, sys
    out, code = sys.argv[1], int(sys.argv[2])
    with open(out, "w") as f:
        # A fresh interpreter: nothing of the doctor's (torch) is imported before the script's own imports.
        json.dump({"ppid": os.getppid(), "torch_imported": "torch" in sys.modules, "rank": os.environ["RANK"]}, f)
    sys.exit(code)
""")


def _probe(tmp_path, exit_code: int, with_thread: bool) -> tuple[dict, dict]:
    probe, rank = tmp_path / "probe.py", tmp_path / "rank.py"
    probe.write_text(PROBE)
    rank.write_text(RANK)
    out = tmp_path / "rank.json"
    proc = subprocess.run([sys.executable, str(probe), str(rank), str(out), str(exit_code), str(int(with_thread))],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), json.loads(out.read_text())


def test_the_own_launcher_is_forked_and_its_ranks_are_fresh_interpreters(tmp_path):
    launcher, rank = _probe(tmp_path, 0, with_thread=False)
    assert launcher["kind"] == "ForkedLauncher" and launcher["code"] == 0, launcher
    # torchrun (the forked launcher) started the rank as a new process that imported nothing of the doctor's.
    assert rank == {"ppid": launcher["pid"], "torch_imported": False, "rank": "0"}


def test_a_failing_rank_fails_the_forked_launcher(tmp_path):
    launcher, _ = _probe(tmp_path, 3, with_thread=False)
    assert launcher["kind"] == "ForkedLauncher" and launcher["code"] != 0, launcher


def test_with_another_thread_running_the_launcher_is_a_new_process(tmp_path):
    launcher, rank = _probe(tmp_path, 0, with_thread=True)
    assert launcher["kind"] == "Popen" and launcher["code"] == 0 and rank["ppid"] == launcher["pid"], launcher


def test_only_this_interpreters_turbotrain_launch_is_forked():
    assert own_launch_argv([sys.executable, "-m", "turbotrain", "launch", "x.py"]) == ["launch", "x.py"]
    assert own_launch_argv(["torchrun", "--nproc-per-node", "2", "x.py"]) is None
    assert own_launch_argv(["/other/python", "-m", "turbotrain", "launch", "x.py"]) is None
