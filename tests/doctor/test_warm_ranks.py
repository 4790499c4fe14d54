"""Warm ranks (doctor/job/warm_ranks.py): torchrun starts a rank through the client, the server forks it, and the
rank runs as ``python -u script.py`` would in a new interpreter; whatever a fork would do differently starts cold.

Each test runs the client as torchrun does (``PYTHON_EXEC -u script.py ARGS``, the rank's environment). No time is
read.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from turbotrain.doctor.job.warm_ranks import WarmRanks, differs

pytestmark = [
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="warm ranks are Linux's (fork, /proc)"),
    pytest.mark.reads_no_time,
]

PROBE = textwrap.dedent("""\
    import json, os, sys
    seen = dict(argv=sys.argv, cwd=os.getcwd(), path0=sys.path[0], rank=os.environ.get("RANK"), parent=os.getppid(),
                pid=os.getpid(), session=os.getsid(0), site=os.environ.get("SITE_RAN"), stdin=sys.stdin.read(),
                inductor=os.environ.get("TORCHINDUCTOR_CACHE_DIR"), write_through=sys.stdout.write_through,
                cache=os.environ.get("TURBOTRAIN_CACHE"))
    print(json.dumps(seen))
    print("to stderr", file=sys.stderr)
    if sys.argv[1] == "term":
        os.kill(os.getpid(), 15)
    raise SystemExit(int(sys.argv[1]))
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module (it imports torch); the rank's folder holds a sitecustomize as the doctor's does.
    Its starter allows the tune cache's folder to differ from rank to rank, as the test suite's session server does."""
    tmp = tmp_path_factory.mktemp("warm-ranks")
    (tmp / "site").mkdir()
    (tmp / "site" / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = 'yes'\n")
    (tmp / "job").mkdir()
    (tmp / "job" / "probe.py").write_text(PROBE)
    (tmp / "server").mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_EXEC"}
    env["OMP_NUM_THREADS"] = "1"
    warm = WarmRanks(env, str(tmp / "server"), may_differ=("TURBOTRAIN_CACHE",))
    assert warm.pid is not None, "the server did not start"
    yield warm, env, tmp
    warm.close()


def _rank(warm: WarmRanks, env: dict, tmp: Path, *args: str, **changes: str) -> subprocess.CompletedProcess:
    rank_env = {**env, **warm.env(), "RANK": "1", "PYTHONPATH": str(tmp / "site"), **changes}
    client = warm.env()["PYTHON_EXEC"]
    return subprocess.run([client, *args], env=rank_env, cwd=tmp, input="from stdin", capture_output=True,
                          text=True, timeout=120)


def test_a_rank_runs_as_a_new_interpreter_would_with_its_exit_and_output(server):
    warm, env, tmp = server
    done = _rank(warm, env, tmp, "-u", "job/probe.py", "3")
    assert done.returncode == 3, done.stderr
    seen = json.loads(done.stdout)
    assert seen["parent"] == warm.pid  # forked by the server: warm
    assert seen["argv"] == ["job/probe.py", "3"] and seen["cwd"] == str(tmp)
    assert seen["path0"] == str(tmp / "job")  # the script's folder first, as `python script.py` puts it
    assert seen["rank"] == "1" and seen["site"] == "yes"  # its own environment, and the sitecustomize on its path
    assert seen["session"] == seen["pid"]  # a session of its own, as torchrun starts each rank
    assert seen["stdin"] == "from stdin" and seen["write_through"]  # its streams; -u
    # What torch's import set in the server (its Inductor cache folder) is set in the rank, as its import would.
    assert seen["inductor"]
    assert done.stderr == "to stderr\n"


def test_a_key_the_starter_allows_to_differ_is_the_ranks_own_in_a_warm_fork(server):
    warm, env, tmp = server
    done = _rank(warm, env, tmp, "-u", "job/probe.py", "0", TURBOTRAIN_CACHE=str(tmp / "rank-cache"))
    seen = json.loads(done.stdout)
    assert seen["parent"] == warm.pid and seen["cache"] == str(tmp / "rank-cache"), seen
    # Only that key: a thread count the server's imports read still starts cold.
    done = _rank(warm, env, tmp, "-u", "job/probe.py", "0", TURBOTRAIN_CACHE="elsewhere", OMP_NUM_THREADS="2")
    assert json.loads(done.stdout)["parent"] == os.getpid(), done.stdout


def test_a_rank_ended_by_a_signal_ends_its_client_the_same_way(server):
    warm, env, tmp = server
    done = _rank(warm, env, tmp, "-u", "job/probe.py", "term")
    assert done.returncode == -signal.SIGTERM and json.loads(done.stdout)["parent"] == warm.pid


@pytest.mark.parametrize("args, changes", [
    (("-u", "job/probe.py", "0"), {"OMP_NUM_THREADS": "2"}),  # read at torch's import: the server's is 1
    (("job/probe.py", "0"), {}),  # not torchrun's `-u script.py`
])
def test_what_a_fork_would_run_otherwise_starts_cold(server, args, changes):
    warm, env, tmp = server
    done = _rank(warm, env, tmp, *args, **changes)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["parent"] == os.getpid() and seen["site"] == "yes"  # the real interpreter, in the client's place


def test_a_signal_to_the_client_reaches_the_rank_and_a_killed_client_takes_its_rank(server):
    warm, env, tmp = server
    (tmp / "job" / "waits.py").write_text(
        "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    for sig, exit_code in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)):
        pid_file = tmp / f"rank-{sig}.pid"
        rank_env = {**env, **warm.env(), "RANK": "0", "PYTHONPATH": str(tmp / "site")}
        client = subprocess.Popen([warm.env()["PYTHON_EXEC"], "-u", "job/waits.py", str(pid_file)], env=rank_env,
                                  cwd=tmp, start_new_session=True)
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and client.poll() is None, "the rank did not start"
            time.sleep(0.05)
        rank = int(pid_file.read_text())
        assert rank != client.pid
        os.kill(client.pid, sig)
        assert client.wait(timeout=30) == exit_code
        deadline = time.monotonic() + 30
        while _alive(rank):
            assert time.monotonic() < deadline, f"the rank outlived its client killed by {sig!r}"
            time.sleep(0.05)


def test_only_what_differs_per_run_may_differ():
    server = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "TURBOTRAIN_DOCTOR_RUN": "x"}
    rank = {**server, "RANK": "1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "r", "PYTHONPATH": "/site",
            "TURBOTRAIN_DOCTOR_JOB_DIR": "/job"}
    imported = {"TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor"}  # what the server's imports set
    assert differs(rank, server, imported) == []
    assert differs({**rank, "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor"}, server, imported) == []
    assert differs({**rank, "TORCHINDUCTOR_CACHE_DIR": "/elsewhere"}, server, imported) == ["TORCHINDUCTOR_CACHE_DIR"]
    assert differs({**rank, "OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "1"}, server, imported) == [
        "MKL_NUM_THREADS", "OMP_NUM_THREADS"]
    assert differs({k: v for k, v in rank.items() if k != "PATH"}, server, imported) == ["PATH"]
    assert differs({**rank, "TMPDIR": "/t", "PATH": "/usr/bin"}, server, imported, may_differ={"TMPDIR"}) == ["PATH"]


def test_close_ends_the_server_and_counts_what_it_served(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_EXEC"}
    warm = WarmRanks(env, str(folder))
    pid = warm.pid
    assert pid is not None and _alive(pid)
    (tmp_path / "ok.py").write_text("print('ran')\n")
    done = subprocess.run([warm.env()["PYTHON_EXEC"], "-u", "ok.py"], env={**env, **warm.env()}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout == "ran\n", done.stderr
    warm.close()
    assert not _alive(pid) and warm.served == 1 and warm.env() == {}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False



def test_a_doctor_runs_a_repeated_job_on_warm_ranks_and_records_them(tmp_path):
    """run_job(warm=True), as the job what-ifs and --verify run it: both ranks forked by the doctor run's server,
    recorded as cold ones are, and nothing left running after the doctor run."""
    from turbotrain.doctor import lifeline
    from turbotrain.doctor.job.launcher import run_job

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import os, sys, torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.parent"), "w").write(str(os.getppid()))
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(6):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            opt.zero_grad()
        dist.destroy_process_group()
    """))
    command = [sys.executable, "-m", "turbotrain", "launch", "--nproc-per-node", "2", str(script), str(tmp_path)]
    with lifeline.guarded():
        job = run_job(command, steps=3, warmup=1, profile=0, warm=True, cwd=tmp_path)
        server = lifeline.held("warm-ranks")
        assert server is not None and server.pid is not None
        server_pid = server.pid
    assert job.failure is None and job.left_behind == [], (job.failure, [r.run for r in job.ranks])
    assert [int((tmp_path / f"rank{r}.parent").read_text()) for r in (0, 1)] == [server_pid, server_pid]
    assert len(job.recordings) == 2 and all(len(r.steps) >= 3 for r in job.recordings)  # 3 measured, recorded
    assert server.served == 2 and not _alive(server_pid)
