"""Warm ranks: the ranks of the jobs the doctor launches itself start from an interpreter that imported torch once.

``doctor --nproc-per-node N`` runs the job once to record it, then again for every fix and round its what-ifs time,
and each rank of each run is a new interpreter that spends ~3 s importing torch and ``torch._dynamo`` (every
optimizer imports it) before the script's first line: most of a short run, on every rank. One server per doctor
run imports them, and the recorder, and touches nothing else (no tensor op, no thread, no CUDA); torchrun starts
each rank through :data:`PYTHON_EXEC` (its documented override of the interpreter), which is a small client here: it
hands the server its arguments, environment, folder and standard streams, the server forks a process that becomes
``python -u script.py ARGS`` as a new interpreter would (the job's ``sitecustomize``, the script's folder first on
``sys.path``, unbuffered output, a session of its own), and the client relays signals to it and exits with its code.
The allocator of the fork has freed nothing yet, as a new interpreter's has.

What a fork cannot start the same way goes to a new interpreter, as before: a command other than ``-u script.py``,
an environment that differs from the server's in more than what differs from run to run and rank to rank
(:data:`PER_RUN`; a thread count, say, is read once at torch's import), a server whose imports started a thread or
loaded the CUDA driver, off Linux.

The kernel shows a fork the server's environment and command line: the doctor knows its ranks as the server's
children (:meth:`WarmRanks.forked`), and its guard finds them by the server's mark (doctor/lifeline.py).
"""

from __future__ import annotations

import io
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
from typing import Any, Collection, Iterable, Mapping

from ...fork_server import JsonLines, exit_code_of, refusal, say, stop_server

__all__ = ["WarmRanks", "PER_RUN", "ENV_SOCKET"]

ENV_SOCKET = "TURBOTRAIN_DOCTOR_WARM_RANKS"  # the server's socket, for the client
PRELOAD = ("torch", "torch._dynamo", "turbotrain.doctor.job.rank_main", "turbotrain.doctor.record.recorder")
# What torchrun, turbotrain launch and the doctor set per run or per rank; none is read at torch's import.
PER_RUN = frozenset({
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "PYTHON_EXEC", ENV_SOCKET,
})  # fmt: skip
PER_RUN_PREFIXES = ("TORCHELASTIC_", "PET_", "NCCL_", "TORCH_NCCL_", "GLOO_", "TURBOTRAIN_DOCTOR_JOB_")
_READY_S = 120.0
_EXIT_S = 5.0
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

# The interpreter torchrun starts for each rank: standard library only, no site (milliseconds). Anything the server
# does not answer with a pid runs the real interpreter in its place, with the same arguments.
CLIENT = """import json, os, signal, socket, sys

REAL = {real!r}
argv = sys.argv[1:]


def cold():
    os.execv(REAL, [REAL, *argv])


path = os.environ.get({env_socket!r})
if not path or len(argv) < 2 or argv[0] != "-u" or not argv[1].endswith(".py"):
    cold()
try:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    os.chdir(os.path.dirname(path))  # a socket's path has room for 107 bytes: its name alone is short
    try:
        server.connect(os.path.basename(path))
    finally:
        os.chdir(cwd)
    socket.send_fds(server, [b"R"], [0, 1, 2])
    server.sendall(json.dumps({{"argv": argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}}).encode() + b"\\n")
    replies = server.makefile("rb")
    started = json.loads(replies.readline() or b"{{}}")
except (OSError, ValueError):
    cold()
if "pid" not in started:
    cold()
pid = started["pid"]


def relay(signum, frame):  # to the rank's process group, as a signal to a rank's session reaches its workers
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


for sig in {signals!r}:
    signal.signal(sig, relay)
try:
    code = json.loads(replies.readline() or b"{{}}").get("returncode", 1)
except (OSError, ValueError):
    code = 1
if code < 0:  # ended by a signal: so is this process, and the launcher reads the same exit
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
os._exit(code & 0xFF)
"""


class WarmRanks:
    """The server for one doctor run, started with ``env``; :meth:`env` is what a launcher's environment adds."""

    def __init__(self, env: Mapping[str, str], folder: str, may_differ: Iterable[str] = ()) -> None:
        """``may_differ``: keys beyond :data:`PER_RUN` that the starter knows differ from rank to rank and that the
        server's imports do not read (the test suite's per-test folders); the doctor passes none."""
        self.folder = folder  # private to this doctor run: the socket and the client live there
        self.pid: int | None = None
        self.served = 0  # ranks forked, known once closed
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: JsonLines | None = None
        self._socket = os.path.join(folder, "ranks.sock")
        self._client = os.path.join(folder, "python")
        shebang = f"#!{sys.executable} -IS\n"  # -I: not this job's PYTHONPATH; -S: no site, milliseconds to start
        if not sys.platform.startswith("linux") or len(shebang) > 250:  # the kernel reads up to 255 bytes of it
            return
        with open(self._client, "w") as fh:
            fh.write(
                shebang + CLIENT.format(real=sys.executable, env_socket=ENV_SOCKET, signals=[int(s) for s in _SIGNALS])
            )
        os.chmod(self._client, 0o700)
        argv = [str(os.getpid()), os.path.basename(self._socket), json.dumps(sorted(may_differ)), *PRELOAD]
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=dict(env),
            cwd=folder,  # the socket is bound by its name there
        )
        self._lines = JsonLines(self._proc)
        line = self._lines.next(_READY_S)
        if line is None or not line.get("ready"):
            self.close()  # it says why (a thread, CUDA) or died: every rank starts cold
            return
        self.pid = self._proc.pid

    def env(self) -> dict[str, str]:
        """What a launcher's environment adds for its ranks to start warm; nothing where the server is not up."""
        if self._proc is None or self.pid is None or self._proc.poll() is not None:
            return {}
        return {"PYTHON_EXEC": self._client, ENV_SOCKET: self._socket}

    def forked(self, pid: int) -> bool:
        """``pid`` is a rank this server forked, still running."""
        if self.pid is None:
            return False
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            return False
        fields = stat.rpartition(")")[2].split()
        return fields[0] != "Z" and int(fields[1]) == self.pid

    def close(self) -> None:
        proc, self._proc, self.pid = self._proc, None, None
        if proc is not None:
            # The server ends its ranks, says how many it served, and exits.
            self.served = int((stop_server(proc, self._lines) or {}).get("served", 0))


def differs(
    env: Mapping[str, str],
    server: Mapping[str, str],
    imports_set: Mapping[str, str],
    may_differ: Collection[str] = frozenset(),
) -> list[str]:
    """The keys in which a rank's environment differs from the server's, past those that differ per run (and
    ``may_differ``) and those the rank has as the server's imports set them (its launcher imported torch too)."""
    keys = set(env) ^ set(server) | {k for k in set(env) & set(server) if env[k] != server[k]}
    return sorted(
        k
        for k in keys
        if k not in PER_RUN
        and k not in may_differ
        and not k.startswith(PER_RUN_PREFIXES)
        and not (k in imports_set and env.get(k) == imports_set[k])
    )


# -- the server ------------------------------------------------------------------------------------------------


def serve(parent: int, name: str, may_differ: frozenset[str], preload: list[str]) -> None:
    import importlib

    from ...fresh_trial import die_with_parent

    die_with_parent(parent)
    for module in preload:
        importlib.import_module(module)
    # The environment this process started with (the kernel keeps it; turbotrain's package imported torch before
    # this line), and what the imports set in it (torch's Inductor names its cache folder): a rank's would too.
    with open("/proc/self/environ", "rb") as fh:
        started_env = dict(
            item.decode(errors="surrogateescape").partition("=")[::2] for item in fh.read().split(b"\0") if item
        )
    imports_set = {k: v for k, v in os.environ.items() if started_env.get(k) != v}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(name):
        os.unlink(name)  # an earlier server's, in this folder that is the doctor run's, private to it
    listener.bind(name)
    listener.listen(16)
    why = refusal() or _no_pidfd()
    say({"ready": why is None, "refused": why})
    if why is not None:
        return
    python_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in python_path]  # what a new interpreter has past PYTHONPATH
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "doctor")
    ranks: dict[int, tuple[socket.socket, int]] = {}  # pidfd -> (the client's connection, the rank's pid)
    served = 0
    while True:
        for key, _ in selector.select():
            if key.data == "doctor":  # end of input: the doctor is done with the server
                for _client, pid in ranks.values():
                    _kill_group(pid)
                    os.waitpid(pid, 0)
                say({"served": served})
                return
            if key.data == "accept":
                client, _ = listener.accept()
                held = [listener, selector, *(c for c, _ in ranks.values()), *ranks]
                forked = _start_rank(client, started_env, imports_set, may_differ, python_path, base_path, held)
                if forked is None:
                    client.close()
                    continue
                served += 1
                pidfd = os.pidfd_open(forked)
                ranks[pidfd] = (client, forked)
                selector.register(pidfd, selectors.EVENT_READ, "rank")
                selector.register(client, selectors.EVENT_READ, "client")
            elif key.data == "rank":  # the rank ended: its client exits with its code
                client, pid = ranks.pop(key.fd)
                selector.unregister(key.fd)
                if client.fileno() in selector.get_map():
                    selector.unregister(client)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                _send(client, {"returncode": os.waitstatus_to_exitcode(status)})
                client.close()
            elif key.data == "client":  # the client went first (killed): its rank goes too
                for client, pid in ranks.values():
                    if client is key.fileobj:
                        _kill_group(pid)  # the rank's pidfd reports its end next
                        selector.unregister(client)
                        break


def _no_pidfd() -> str | None:
    """The server learns a rank's end through its pidfd (Linux 5.3)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as exc:
        return f"no pidfd on this system ({exc})"
    return None


def _start_rank(
    client: socket.socket,
    started_env: dict[str, str],
    imports_set: dict[str, str],
    may_differ: frozenset[str],
    python_path: list[str],
    base_path: list[str],
    held: list[Any],
) -> int | None:
    """Read a client's request and fork its rank; None (the client starts cold) where a fork would differ. ``held``:
    what the server holds open (its socket, selector, the other ranks' connections and pidfds), closed in the fork."""
    client.settimeout(_EXIT_S)
    try:
        _, fds, _, _ = socket.recv_fds(client, 1, 3)
        request = json.loads(client.makefile("rb").readline())
    except (OSError, ValueError):
        return None
    finally:
        client.settimeout(None)
    different = differs(request["env"], started_env, imports_set, may_differ)
    if len(fds) != 3 or different:
        for fd in fds:
            os.close(fd)
        _send(client, {"refused": f"the environment differs in {different}"})
        return None
    request["env"] = {**imports_set, **request["env"]}
    pid = os.fork()
    if pid == 0:
        _close(held)
        _become_rank(request, fds, python_path, base_path)  # never returns
    for fd in fds:
        os.close(fd)
    _send(client, {"pid": pid})
    return pid


def _become_rank(request: dict[str, Any], fds: list[int], python_path: list[str], base_path: list[str]) -> None:
    """In the fork: become ``python -u SCRIPT ARGS`` started with the request's environment, folder and streams."""
    code = 1
    try:
        os.setsid()  # torchrun starts each rank in a session of its own
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile

        tempfile.tempdir = None  # read from TMPDIR on first use, as a new interpreter does
        script, *args = request["argv"]
        sys.argv = [script, *args]
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.path.dirname(os.path.abspath(script)), *paths, *[p for p in base_path if p not in paths]]
        for name in ("stdout", "stderr"):  # -u: unbuffered
            raw = io.FileIO(1 if name == "stdout" else 2, "w", closefd=False)
            stream = io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", write_through=True)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        _run_site()  # the job's sitecustomize: a rank runs there under the recorder and exits
        import runpy

        code = exit_code_of(lambda: runpy.run_path(script, run_name="__main__"))
    finally:
        os._exit(code)


def _run_site() -> None:
    """What ``site`` does at a new interpreter's start that the server's start did under another path: the
    ``sitecustomize`` first on this path."""
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _close(held: list[Any]) -> None:
    for thing in held:
        if isinstance(thing, int):
            os.close(thing)  # a pidfd
        else:
            thing.close()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _send(client: socket.socket, message: dict[str, Any]) -> None:
    try:
        client.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the client is gone


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], frozenset(json.loads(sys.argv[3])), sys.argv[4:])
