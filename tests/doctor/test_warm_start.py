"""--verify's warm start (doctor/fixes/warm_start.py): each run a process of its own, forked from one server, run as
``python -m MODULE`` would be in a new interpreter; a run it cannot start that way is left to a new interpreter.

The servers here preload small standard modules (the doctor's preloads torch): milliseconds a run. No time is read.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from turbotrain.doctor.fixes.warm_start import WarmStart

pytestmark = [
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="the warm start is Linux's (fork, /proc)"),
    pytest.mark.reads_no_time,
]

PROBE = textwrap.dedent("""\
    import json, os, sys
    import probe_state
    seen = dict(argv=sys.argv[1:], cwd=os.getcwd(), path0=sys.path[0], env=os.environ.get("WARM_TEST"),
                parent=os.getppid(), pid=os.getpid(), before=probe_state.VALUE)
    probe_state.VALUE = "set by a run"  # a module the server imported: a later run must not see this
    print(json.dumps(seen))
    print("to stderr", file=sys.stderr)
    raise SystemExit(int(sys.argv[1]))
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module's tests (starting one imports turbotrain, whose package imports torch)."""
    tmp_path = tmp_path_factory.mktemp("warm")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "probe_state.py").write_text('VALUE = "as imported"\n')
    (tmp_path / "lib" / "probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "lib"), "WARM_TEST": "yes"}
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    warm = WarmStart(env, str(outputs), preload=("json", "probe_state"))
    yield warm, env, tmp_path
    warm.close()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_each_run_is_its_own_fork_of_the_server_with_its_folder_arguments_and_output(server):
    warm, env, tmp_path = server
    assert warm.pid is not None
    runs = []
    for code, folder in ((3, tmp_path), (0, tmp_path / "lib")):
        finished = warm.run("probe", [str(code)], env, str(folder), timeout_s=60)
        assert finished is not None and finished.returncode == code, finished
        assert finished.stderr == "to stderr\n"
        runs.append(__import__("json").loads(finished.stdout))
        assert runs[-1]["cwd"] == runs[-1]["path0"] == str(folder)  # `-m` puts the run's folder first
    assert [r["argv"] for r in runs] == [["3"], ["0"]] and {r["env"] for r in runs} == {"yes"}
    assert {r["parent"] for r in runs} == {warm.pid} and runs[0]["pid"] != runs[1]["pid"] != warm.pid
    assert [r["before"] for r in runs] == ["as imported", "as imported"]  # nothing one run set reached the next
    assert not _alive(runs[0]["pid"]) and not _alive(runs[1]["pid"])


def test_an_error_exits_1_with_its_traceback_after_the_atexit_functions(server):
    warm, env, tmp_path = server
    (tmp_path / "lib" / "fails.py").write_text(
        "import atexit\natexit.register(lambda: print('atexit ran'))\nraise ValueError('the error')\n"
    )
    finished = warm.run("fails", [], env, str(tmp_path), timeout_s=60)
    assert finished is not None and finished.returncode == 1
    assert "ValueError: the error" in finished.stderr and finished.stdout == "atexit ran\n"


def test_a_run_past_its_limit_is_killed_and_the_server_serves_the_next(server):
    warm, env, tmp_path = server
    (tmp_path / "lib" / "sleeps.py").write_text("import time\ntime.sleep(60)\n")
    finished = warm.run("sleeps", [], env, str(tmp_path), timeout_s=0.5)
    assert finished is not None and finished.returncode is None and not _alive(finished.pid)
    again = warm.run("probe", ["0"], env, str(tmp_path), timeout_s=60)
    assert again is not None and again.returncode == 0


def test_another_environment_is_left_to_a_new_interpreter(server):
    warm, env, tmp_path = server
    assert warm.run("probe", ["0"], {**env, "WARM_TEST": "other"}, str(tmp_path), timeout_s=60) is None


def test_a_server_whose_imports_start_a_thread_refuses_and_close_leaves_no_process(tmp_path):
    (tmp_path / "threaded.py").write_text("import threading, time\nthreading.Thread(target=time.sleep, args=(60,), "
                                          "daemon=True).start()\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    refused = WarmStart(env, str(tmp_path), preload=("threaded",))
    assert refused.pid is None and refused.run("json.tool", ["--help"], env, str(tmp_path), 60) is None
    served = WarmStart(env, str(tmp_path), preload=("json",))
    pid = served.pid
    assert pid is not None and _alive(pid)
    served.close()
    assert not _alive(pid) and served.run("json.tool", ["--help"], env, str(tmp_path), 60) is None


def test_a_server_for_any_environment_runs_each_in_its_own_with_its_temporary_folder(tmp_path):
    """The test suite's command lines (tests/warm_command.py): each run's environment, TMPDIR included, as given,
    though the server had read its own TMPDIR (tempfile caches it) before the fork."""
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    (tmp_path / "cached.py").write_text("import tempfile\ntempfile.gettempdir()\n")
    (tmp_path / "where.py").write_text("import os, tempfile\nprint(os.environ['WARM_TEST'], tempfile.gettempdir())\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TMPDIR": str(tmp_path / "first"), "WARM_TEST": "one"}
    warm = WarmStart(env, str(tmp_path), preload=("cached",), any_env=True)
    try:
        other = {**env, "TMPDIR": str(tmp_path / "second"), "WARM_TEST": "two"}
        finished = warm.run("where", [], other, str(tmp_path), timeout_s=60)
        assert finished is not None and finished.returncode == 0, finished
        assert finished.stdout.split() == ["two", str(tmp_path / "second")]
    finally:
        warm.close()
