"""Time a Plan on a model in a process of its own, as the user's training process would run it.

Why a process of its own: glibc's malloc adapts to what a process has freed (its mmap threshold rises to
the largest block freed, its trim threshold to twice that), so how many of a step's large tensors are
page-faulted in afresh every step depends on everything the process did before. A trial run inside the
doctor, after the user's script and other trials, inherits that history; the user's training process does
not. Measured on a 2-core AMD EPYC: one bf16-autocast MLP step took 5.4 ms with a warm allocator and
8.6 ms in a fresh process (1,700 page faults per step), its float32 step 10.2 ms fresh, so the gain a
warm process showed (x1.9) was not the one a training run gets (x1.3).

:class:`FreshTrial` starts ``python -m turbotrain.fresh_trial``, which loads a bundle written by
:func:`write_bundle` (the model, the batches, the optimizer's class and settings, the step function),
applies the plan and then runs as many steps as it is asked for, one request at a time, so that two of
them (a baseline and a candidate, each its own process) can be timed alternately under the same load.
Each step clears the gradients where the user's loop does: between the forward and the backward
(``zero_grad(); loss.backward()``) or after the optimizer step. That choice decides which freed blocks
the forward's activations reuse; measured on the 2-core EPYC, a float32 MLP step (2.1M parameters) took
10.2-11.7 ms and 300-700 page faults when cleared before its backward, and up to 22 ms and 1,400-1,750
faults in two of three processes when cleared after its step.
A model whose class lives in the user's script is found by running the script's imports and
definitions only (never its training code).
"""

from __future__ import annotations

import ast
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import time
import types
from typing import IO, Any, BinaryIO, Callable

import torch

from .plan import Plan

__all__ = ["FreshTrial", "write_bundle", "FreshTrialError", "die_with_parent"]

_FRAME = struct.Struct("<Q")


class FreshTrialError(RuntimeError):
    """The child process failed (its own error, or it died; the message ends with its stderr)."""


def die_with_parent(parent: int) -> None:
    """In a child process: be killed when ``parent`` (the process, strictly the thread, that started it) ends,
    however it ends (``kill -9`` included), through Linux's ``PR_SET_PDEATHSIG``; exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass  # no prctl: the doctor's guard process still ends this one (doctor/lifeline.py)
    if parent and os.getppid() != parent:
        os._exit(1)  # the parent died before the signal was set: nobody is left to read the answer


def write_bundle(
    path: str,
    model: torch.nn.Module,
    batches: list[Any],
    optimizer: tuple[type, dict],
    step_fn: Callable,
    threads: int | None = None,
) -> None:
    """Save what a :class:`FreshTrial` trains: ``step_fn(model, batch) -> loss`` must be importable (a
    module-level function), as must the model's classes or be defined at the top of ``script``."""
    torch.save(
        {
            "model": model,
            "batches": batches,
            "optimizer": optimizer,
            "step_fn": step_fn,
            "threads": threads or torch.get_num_threads(),
        },
        path,
    )


class FreshTrial:
    """One child process training the bundle's model under ``plan``. ``steps(n)`` runs ``n`` more steps
    there and returns their seconds each; the process keeps its model, optimizer and allocator between
    calls. A context manager: the child ends on exit (and on :meth:`close`), and with this process however it
    ends (:func:`die_with_parent`). ``extra_env``: variables added to the child's environment."""

    def __init__(
        self,
        bundle: str,
        plan: Plan,
        script: str | None = None,
        warmup: int = 3,
        timeout_s: float = 120.0,
        clear_grads_before_backward: bool = False,
        extra_env: dict[str, str] | None = None,
    ):
        self.timeout_s = timeout_s
        self._err = tempfile.TemporaryFile()
        read_end, write_end = os.pipe()
        try:
            # stdout goes nowhere: a print in the user's forward must not garble the replies (own pipe).
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "turbotrain.fresh_trial", str(write_end), str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=self._err,
                pass_fds=(write_end,),
                env={**_child_env(), **(extra_env or {})},
            )
        except OSError:
            os.close(read_end)
            self._err.close()
            raise
        finally:
            os.close(write_end)
        assert self._proc.stdin is not None  # stdin=PIPE
        self._stdin: IO[bytes] = self._proc.stdin
        self._replies: int | None = read_end
        self._ready: dict | None = None
        try:
            self._send(
                {
                    "bundle": bundle,
                    "plan": plan,
                    "script": script,
                    "warmup": warmup,
                    "clear_grads_before_backward": clear_grads_before_backward,
                }
            )
        except FreshTrialError:
            self.close()
            raise

    def ready(self) -> dict:
        """Wait until the child has loaded the bundle, applied the plan and run its warm-up steps; returns
        ``{"applied": [...], "skipped": [...]}``. Start several trials first, then wait: they load at once."""
        if self._ready is None:
            self._ready = self._receive()
        return self._ready

    def steps(self, n: int) -> list[float]:
        """Seconds of each of ``n`` more steps (the loss of each is read back: a sync per step, as trials do)."""
        self.ready()
        self._send(n)
        return self._receive()["times"]

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                pickle.dump(None, self._stdin)  # "no more steps": the child returns
                self._stdin.flush()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):  # it had ended meanwhile, or hangs
                self._proc.kill()
                self._proc.wait()
        try:
            self._stdin.close()
        except OSError:
            pass  # a pipe whose reader is gone
        if self._replies is not None:
            os.close(self._replies)
            self._replies = None
        self._err.close()

    def __enter__(self) -> "FreshTrial":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, message: Any) -> None:
        try:
            pickle.dump(message, self._stdin)
            self._stdin.flush()
        except BrokenPipeError:
            raise FreshTrialError(f"the trial process ended early{self._stderr_tail()}") from None

    def _receive(self) -> dict:
        header = self._read_exactly(_FRAME.size)
        reply = pickle.loads(self._read_exactly(_FRAME.unpack(header)[0]))  # noqa: S301 - from our own child process
        if "error" in reply:
            raise FreshTrialError(f"the trial process failed: {reply['error']}{self._stderr_tail()}")
        return reply

    def _read_exactly(self, size: int) -> bytes:
        replies = self._replies
        if replies is None:
            raise FreshTrialError("the trial is closed")
        data, deadline = b"", time.monotonic() + self.timeout_s
        while len(data) < size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([replies], [], [], left)[0]:
                self._proc.kill()
                raise FreshTrialError(f"the trial process gave no answer in {self.timeout_s:.0f} s")
            chunk = os.read(replies, size - len(data))
            if not chunk:
                self._proc.wait()
                raise FreshTrialError(f"the trial process ended (exit {self._proc.returncode}){self._stderr_tail()}")
            data += chunk
        return data

    def _stderr_tail(self) -> str:
        self._err.seek(0)
        tail = self._err.read().decode(errors="replace").strip().splitlines()[-3:]
        return (": " + " / ".join(tail)) if tail else ""


def _child_env() -> dict[str, str]:
    """This environment, with the folder this turbotrain was imported from first on the child's path: a
    parent that found it through its own ``sys.path`` (a notebook, a test runner) must not start a child
    that cannot import it."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return env


# ---- the child process ----


def _script_definitions(script: str) -> types.ModuleType:
    """A ``__main__`` holding the script's imports, functions, classes and constant assignments: what
    unpickling a model whose classes the script defines needs, without running its training."""
    with open(script, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=script)
    keep = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    body: list[ast.stmt] = [
        node
        for node in tree.body
        if isinstance(node, keep)
        or (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant))
    ]
    module = types.ModuleType("__main__")
    module.__file__ = script
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # the script's own sibling modules
    exec(compile(ast.Module(body=body, type_ignores=[]), script, "exec"), module.__dict__)  # noqa: S102 - the user's script
    return module


def _load_bundle(path: str, script: str | None) -> dict:
    try:
        return torch.load(path, weights_only=False)
    except (AttributeError, ModuleNotFoundError):
        if script is None:
            raise
    sys.modules["__main__"] = _script_definitions(script)
    return torch.load(path, weights_only=False)


def _serve(requests: BinaryIO, replies: BinaryIO) -> None:
    from .measure import _cycled, _train_step
    from .runtime import prepare

    def reply(message: dict) -> None:
        payload = pickle.dumps(message)
        replies.write(_FRAME.pack(len(payload)) + payload)
        replies.flush()

    job = pickle.load(requests)  # noqa: S301 - the parent process's pipe, not outside data
    done = 0
    clear_before = job.get("clear_grads_before_backward", False)

    def run(n: int) -> list[float]:
        nonlocal done
        times = []
        for _ in range(n):
            started = time.perf_counter()
            _train_step(rt, _cycled(batches, done, rt.accum_steps), None, bundle["step_fn"], clear_before)
            times.append(time.perf_counter() - started)
            done += 1
        return times

    try:
        bundle = _load_bundle(job["bundle"], job["script"])
        torch.set_num_threads(bundle["threads"])
        torch.manual_seed(0)
        model = bundle["model"]
        optimizer_cls, settings = bundle["optimizer"]
        skipped: list[tuple[str, str]] = []
        rt = prepare(
            model,
            optimizer_cls(model.parameters(), **settings),
            job["plan"],
            on_skip=lambda name, why: skipped.append((name, why)),
        )
        batches = [rt.to_device(b) for b in bundle["batches"]]
        run(job["warmup"])
        reply({"applied": list(rt.applied), "skipped": skipped})
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
        reply({"error": f"{type(exc).__name__}: {exc}"})
        return
    while (request := pickle.load(requests)) is not None:  # noqa: S301 - the parent process's pipe
        try:
            reply({"times": run(request)})
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
            reply({"error": f"{type(exc).__name__}: {exc}"})
            return


if __name__ == "__main__":
    die_with_parent(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    _replies = os.fdopen(int(sys.argv[1]), "wb")
    sys.stdout = sys.stderr  # the user's prints stay off the reply pipe
    try:
        _serve(sys.stdin.buffer, _replies)
    except EOFError:
        pass  # the parent went away
    # Nothing is left to run at exit: the interpreter's own tear-down of torch takes most of a second, which the
    # parent waits for in close().
    sys.stderr.flush()
    os._exit(0)
