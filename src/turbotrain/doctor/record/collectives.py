"""Gradient synchronization as each rank saw it: when DDP's all-reduces started and when they completed.

A DistributedDataParallel model built while a recording is active gets a communication hook that runs the
all-reduce it would have run (DDP's default, or the hook the script registers itself) and notes, per bucket,
when the bucket was ready (its gradients computed) and when its all-reduce completed. Per backward pass, the
time from the last bucket ready (the rank's own backward compute is done) to the last completion is the
*exposed* communication: the step waits for it. The part of the all-reduces that ran before the last bucket
was ready overlapped the backward's compute. An all-reduce completes at the same moment on every rank, so its
completion time lines ranks up without trusting host clocks.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .patcher import Patcher

__all__ = ["CommStep", "GradientSync", "REDUCER_TIMES", "ThreadCpu", "union", "merged"]

log = logging.getLogger("turbotrain")


@dataclass(frozen=True, slots=True)
class CommStep:
    """One step's gradient synchronization on one rank (seconds; times on this process's perf_counter)."""

    step: int
    buckets: int  # all-reduces launched (buckets x backward passes that synchronized)
    exposed_s: float  # waited after the rank's own backward compute was done
    busy_s: float  # all-reduces in flight (their intervals' union)
    overlap_s: float  # of ``busy_s``, the part that ran while the backward still computed
    done_at: float  # the step's last all-reduce completed (the same instant on every rank)
    # The script's thread since the previous step's last bucket was ready: seconds on a CPU, and seconds ready to
    # run while another process held the CPU (Linux schedstat; None where the kernel does not say).
    cpu_s: float | None = None
    cpu_wait_s: float | None = None
    passes: int = 1  # backward passes whose gradients were all-reduced (more than one: accumulation without no_sync)
    # Whose communication: "ddp" (its gradient all-reduces), "fsdp" (its all-gathers and reduce-scatters) or
    # "collectives" (the script's own blocking calls), the last two from :mod:`.blocking_collectives`.
    kind: str = "ddp"


# DDP's reducer timings (``_get_ddp_logging_data``, nanoseconds), averaged over its sampled iterations.
REDUCER_TIMES = (
    "avg_forward_compute_time",
    "avg_backward_compute_time",
    "avg_backward_comm_time",
    "avg_backward_compute_comm_overlap_time",
)


class ThreadCpu:
    """One thread's CPU time and its wait for a CPU others held, noted per step (Linux schedstat)."""

    def __init__(self) -> None:
        self.at: dict[int, tuple[int, int]] = {}  # step -> (cpu ns, run-queue wait ns) at its last note
        self._fd: int | None = None
        self.follow_this_thread()
        weakref.finalize(self, ThreadCpu._close, self.__dict__)

    def follow_this_thread(self) -> None:
        ThreadCpu._close(self.__dict__)
        self._path = f"/proc/self/task/{threading.get_native_id()}/schedstat"

    def note(self, step: int) -> None:
        """Read now: the last note of a step is the step's. The file stays open: a read at offset 0 of an open
        /proc file costs about a microsecond, an open and a read ten (it runs in every all-reduce's hook)."""
        try:
            if self._fd is None:
                self._fd = os.open(self._path, os.O_RDONLY)
            fields = os.pread(self._fd, 128, 0).split()
            self.at[step] = (int(fields[0]), int(fields[1]))
        except (OSError, ValueError, IndexError):
            pass

    @staticmethod
    def _close(state: dict[str, Any]) -> None:
        fd, state["_fd"] = state.get("_fd"), None
        if fd is not None:
            os.close(fd)

    def since_last_step(self, step: int) -> tuple[float | None, float | None]:
        """Seconds on a CPU, and seconds waiting for one, from the previous step's note to this step's."""
        now, before = self.at.get(step), self.at.get(step - 1)
        if now is None or before is None:
            return None, None
        return (now[0] - before[0]) / 1e9, (now[1] - before[1]) / 1e9


class GradientSync:
    """Installs the timing hook on every DDP model built while the recording runs; ``steps()`` at the end."""

    def __init__(self, position: Callable[[], tuple[int, int]], live: Callable[[], bool]) -> None:
        self.position = position  # (step index, backward passes so far in it)
        self.live = live  # the recording is still running (after it, the hook only passes through)
        self.cells: dict[tuple[int, int], list[list[float]]] = defaultdict(list)
        self.models = 0
        self._register: Callable | None = None  # DDP's own register_comm_hook
        self.cpu = ThreadCpu()  # the script's thread's CPU time at each step's last bucket
        self.refs: list[weakref.ref] = []  # the DDP models timed, for their reducer's own statistics

    def install(self, patcher: Patcher) -> None:
        self.cpu.follow_this_thread()  # the script's thread
        from torch.nn.parallel import DistributedDataParallel

        patcher.replace(DistributedDataParallel, "__init__", self._wrap_init)
        patcher.replace(DistributedDataParallel, "register_comm_hook", self._wrap_register)
        patcher.replace(DistributedDataParallel, "_register_builtin_comm_hook", self._wrap_builtin)

    # -- the hook ---------------------------------------------------------------------------------

    def _wrap_init(self, original: Callable) -> Callable:
        sync = self

        def __init__(model: Any, *args: Any, **kwargs: Any) -> None:
            original(model, *args, **kwargs)
            sync._attach(model)

        __init__.__doc__ = original.__doc__
        return __init__

    def _wrap_register(self, original: Callable) -> Callable:
        self._register = original

        def register_comm_hook(model: Any, state: object, hook: Callable) -> None:
            inner = getattr(model, "_tt_comm_inner", None)
            if inner is None:  # a model the doctor did not attach to
                return original(model, state, hook)
            if inner.get("user"):
                raise RuntimeError("register_comm_hook can only be called once")
            inner.update(state=state, hook=hook, user=True)  # the doctor's hook now runs the script's
            return None

        register_comm_hook.__doc__ = original.__doc__
        return register_comm_hook

    def _wrap_builtin(self, original: Callable) -> Callable:
        def _register_builtin_comm_hook(model: Any, comm_hook_type: Any) -> None:
            inner = getattr(model, "_tt_comm_inner", None)
            if inner is None:
                return original(model, comm_hook_type)
            import torch.distributed as dist
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            # The Python twins of DDP's two built-in hooks, run by the doctor's hook.
            hook = {
                dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
                dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook,
            }[comm_hook_type]
            inner.update(state=model.process_group, hook=hook, user=True)
            return None

        _register_builtin_comm_hook.__doc__ = original.__doc__
        return _register_builtin_comm_hook

    def _attach(self, model: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        inner: dict[str, Any] = {"state": model.process_group, "hook": default_hooks.allreduce_hook, "user": False}
        cells, position, live, perf, sched = self.cells, self.position, self.live, time.perf_counter, self.cpu.note

        # No annotations: DDP checks a hook's annotations against its own types (dist.GradBucket, Future).
        def timed_allreduce(state, bucket):
            future = inner["hook"](inner["state"], bucket)
            if not live():
                return future
            cell = [perf(), 0.0]
            where = position()
            cells[where].append(cell)
            sched(where[0])

            def completed(done: Any) -> Any:
                cell[1] = perf()
                return done.value()

            return future.then(completed)

        if self._register is None:
            return
        try:
            # DDP's own method: the patched one hands the script's hook to ours.
            self._register(model, None, timed_allreduce)
        except Exception as exc:  # noqa: BLE001 - a model that takes no hook is trained untimed, not broken
            log.warning("turbotrain doctor: gradient synchronization not timed (%s: %s)", type(exc).__name__, exc)
            return
        model._tt_comm_inner = inner
        self.models += 1
        self.refs.append(weakref.ref(model))

    def in_flight(self) -> bool:
        """An all-reduce of the current backward pass has not completed (the rank is waiting on the others)."""
        cells = self.cells.get(self.position()) or []
        return any(not c[1] for c in list(cells))

    def reducer_stats(self) -> dict[str, float]:
        """DDP's own statistics of its first timed model (averaged over the iterations its logger samples: 10,
        20, 50, 100, then every 100), in seconds; empty when none ran long enough to be sampled."""
        for ref in self.refs:
            model = ref()
            if model is None:
                continue
            try:
                data = model._get_ddp_logging_data()
            except Exception:  # noqa: BLE001 - statistics DDP cannot give are statistics the report leaves out
                return {}
            if not data.get("iteration"):
                return {}
            out = {key: data[key] / 1e9 for key in REDUCER_TIMES if isinstance(data.get(key), (int, float))}
            out["sampled_iterations"] = float(data["iteration"])
            # Settings and what the reducer saw, as numbers: the DDP rules read them (0/1 for a flag).
            for key in (
                "bucket_cap_bytes",
                "find_unused_parameters",
                "unused_parameter_size",
                "gradient_as_bucket_view",
                "total_parameter_size_bytes",
                "num_parameter_tensors",
            ):
                if isinstance(data.get(key), (int, bool)):
                    out[key] = float(data[key])
            out["static_graph"] = float(bool(getattr(model, "static_graph", False)))
            # The reducer's own check that the set of unused parameters never changed from one iteration to the
            # next (it compares them only under find_unused_parameters=True).
            graph_static = getattr(getattr(model, "reducer", None), "_ddp_graph_static", None)
            if callable(graph_static):
                out["graph_static"] = float(bool(graph_static()))
            sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
            if isinstance(sizes, str) and sizes.strip():
                out["buckets"] = float(len(sizes.split(",")))  # "4198400, 1052672": bytes of each bucket
            return out
        return {}

    # -- the finished steps ---------------------------------------------------------------------------

    def steps(self) -> tuple[CommStep, ...]:
        by_step: dict[int, list[list[list[float]]]] = defaultdict(list)
        for (step, _), cells in sorted(self.cells.items()):
            done = [c for c in cells if c[1]]
            if done:
                by_step[step].append(done)
        out = []
        for step, passes in sorted(by_step.items()):
            exposed = busy = overlap = 0.0
            for cells in passes:
                ready = max(c[0] for c in cells)
                exposed += max(0.0, max(c[1] for c in cells) - ready)
                spans = union([(c[0], c[1]) for c in cells])
                busy += sum(b - a for a, b in spans)
                overlap += sum(max(0.0, min(b, ready) - a) for a, b in spans)
            cpu, wait = self.cpu.since_last_step(step)
            out.append(
                CommStep(
                    step=step,
                    buckets=sum(len(c) for c in passes),
                    exposed_s=exposed,
                    busy_s=busy,
                    overlap_s=overlap,
                    done_at=max(c[1] for cells in passes for c in cells),
                    cpu_s=cpu,
                    cpu_wait_s=wait,
                    passes=len(passes),
                )
            )
        return tuple(out)


def union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def merged(ddp: tuple[CommStep, ...], blocking: tuple[CommStep, ...]) -> tuple[CommStep, ...]:
    """One record per step: DDP's where its hook timed the step (the script's own calls then come after ranks
    lined up at the all-reduce), else the blocking collectives' (FSDP, gradients averaged by hand)."""
    by_step = {c.step: c for c in blocking}
    by_step.update((c.step, c) for c in ddp)
    return tuple(by_step[s] for s in sorted(by_step))
