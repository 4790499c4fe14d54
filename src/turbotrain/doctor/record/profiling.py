"""The profiler window: torch.profiler over a few steps after the measured ones (op table, trace).

Each step of the window gets a ``turbotrain/step#N`` range; the recorder opens a
``turbotrain/<phase>`` range per phase while ``profiling`` is on (NVTX too on CUDA).
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .compile_watch import GraphTime
from .measurements import Phase

__all__ = [
    "ProfilerWindow",
    "profile_steps_for",
    "events_per_step",
    "PhaseRanges",
    "TopOp",
    "top_ops",
    "op_counts",
    "graph_time",
    "POINTWISE",
]

log = logging.getLogger("turbotrain")


# What profiling a step costs grows with its ops: an LSTMCell called 2,000 times (forward and backward) made 258,000
# events, about 5 KiB each held until read, and reading them took 11 s (2-core AMD EPYC). A step's module calls,
# counted in warm-up, stand in for its ops before the window opens.
EVENTS_PER_MODULE_CALL = 130
PROFILER_EVENTS = 400_000  # about 2 GiB held, and half a minute to read: more and the window is left out


def events_per_step(module_calls_per_step: int) -> int:
    """The profiler events a step makes, estimated from its module calls."""
    return EVENTS_PER_MODULE_CALL * module_calls_per_step


def profile_steps_for(module_calls_per_step: int, asked: int) -> int:
    """How many of the ``asked`` steps to profile within :data:`PROFILER_EVENTS` (0: not one)."""
    events = events_per_step(module_calls_per_step)
    if events <= 0:
        return asked
    return min(asked, PROFILER_EVENTS // events)


class ProfilerWindow:
    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        self.profiler: Any = None  # torch.profiler.profile once the window ran
        self.nvtx = False  # phases also push NVTX ranges (CUDA, while profiling)
        self._step_range: Any = None

    def start(self, index: int) -> bool:
        """Start profiling at step ``index``; False (and a warning) when the profiler cannot start."""
        from torch.profiler import ProfilerActivity, profile

        # kineto prints "USDT: ... profiler_start/stop" banners on stderr at its highest level (5) in
        # torch 2.13, so only 6 silences them; read when the first profiler starts, a user's value wins.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.gpu else [])
        try:
            self.profiler = profile(activities=activities, record_shapes=False, with_stack=False)
            self.profiler.__enter__()
        except Exception as exc:  # noqa: BLE001 - a profiler that cannot start costs the trace, not the run
            log.warning("turbotrain doctor: torch.profiler did not start (%s); no trace or op table", exc)
            self.profiler = None
            return False
        self.nvtx = self.gpu
        self.open_step_range(index)
        return True

    def open_step_range(self, index: int) -> None:
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
        self._step_range = torch.autograd.profiler.record_function(f"turbotrain/step#{index}")
        self._step_range.__enter__()

    def stop(self) -> None:
        """End the window (the clock closes the phase ranges still open first: :meth:`PhaseClock.end_spans`)."""
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        try:
            self.profiler.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - a profiler that fails to stop costs the trace, not the run
            log.warning("turbotrain doctor: torch.profiler failed to stop (%s)", exc)
            self.profiler = None


class PhaseRanges:
    """A ``turbotrain/<phase>`` range around each phase while the window is open (NVTX too on CUDA):
    the :class:`~turbotrain.doctor.record.clock.Spans` the phase clock opens and closes."""

    def __init__(self, nvtx: bool) -> None:
        self.nvtx = nvtx

    def open(self, phase: Phase) -> object:
        span = torch.autograd.profiler.record_function(f"turbotrain/{phase}")
        span.__enter__()
        if self.nvtx:
            torch.cuda.nvtx.range_push(f"turbotrain/{phase}")
        return span

    def close(self, span: object) -> None:
        span.__exit__(None, None, None)  # type: ignore[attr-defined]  # a record_function made by open()
        if self.nvtx:
            torch.cuda.nvtx.range_pop()


@dataclass(frozen=True, slots=True)
class TopOp:
    """One op of the profiler window, per step: its calls and its self time on the host and the device."""

    # The fields, in their order, are its keys in the JSON's top_ops (asdict): renaming one changes the report.
    op: str
    calls_per_step: float
    self_cpu_ms_per_step: float
    self_device_ms_per_step: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def top_ops(profiler: Any, steps: int, limit: int = 15) -> list[TopOp]:
    """The busiest ops of the profiler window, per step (device time where there is any, else CPU time)."""
    if profiler is None or steps <= 0:
        return []
    try:
        averages = profiler.key_averages()
    except Exception:  # noqa: BLE001 - a profiler that collected nothing has no averages to give
        return []
    rows = []
    for evt in averages:
        if evt.key.startswith(("turbotrain/", "ProfilerStep", "Optimizer.")):
            continue
        device_us = getattr(evt, "self_device_time_total", 0.0) or 0.0
        rows.append(
            TopOp(
                op=evt.key,
                calls_per_step=round(evt.count / steps, 2),
                self_cpu_ms_per_step=round(evt.self_cpu_time_total / 1e3 / steps, 4),
                self_device_ms_per_step=round(device_us / 1e3 / steps, 4),
            )
        )
    on_device = any(r.self_device_ms_per_step for r in rows)
    return sorted(rows, key=lambda r: -(r.self_device_ms_per_step if on_device else r.self_cpu_ms_per_step))[:limit]


def op_counts(profiler: Any, steps: int) -> dict[str, Any]:
    """Top-level aten ops per step in the profiler window, and the share of op time in pointwise ops."""
    if profiler is None or steps <= 0:
        return {}
    try:
        events = profiler.events()
    except Exception:  # noqa: BLE001 - a profiler that collected nothing
        return {}
    top = 0
    pointwise = total = 0.0
    for ev in events:
        if not ev.name.startswith("aten::"):
            continue
        parent, skip = ev.cpu_parent, False
        while parent is not None:
            name = parent.name
            if name.startswith("aten::") or name in _NOT_COMPUTE:
                skip = True  # nested in another op, or loading data / syncing / validating: not step compute
                break
            parent = parent.cpu_parent
        if skip:
            continue
        top += 1
        self_us = ev.self_cpu_time_total
        total += self_us
        if ev.name[6:].rstrip("_") in POINTWISE:
            pointwise += self_us
    return {"ops_per_step": top / steps, "pointwise_share": pointwise / total if total else 0.0}


# torch.profiler's names for running a compiled graph: dynamo's forward region, and AOTAutograd's backward node.
_FORWARD_GRAPH = "Torch-Compiled Region"
_BACKWARD_GRAPH = "autograd::engine::evaluate_function: CompiledFunctionBackward"


def graph_time(profiler: Any) -> GraphTime | None:
    """Per profiled step (the ``turbotrain/step#N`` ranges): the time in torch.compile's graphs, forward and
    backward, and the whole step; None where no compiled graph ran in the window."""
    if profiler is None:
        return None
    try:
        events = profiler.events()
    except Exception:  # noqa: BLE001 - a profiler that collected nothing
        return None
    steps = [ev for ev in events if ev.name.startswith("turbotrain/step#")]
    forward = backward = 0.0
    for ev in events:
        if _inside_a_graph(ev):
            continue
        if ev.name.startswith(_FORWARD_GRAPH):
            forward += ev.cpu_time_total
        elif ev.name == _BACKWARD_GRAPH:
            backward += ev.cpu_time_total
    if not steps or not forward + backward:
        return None
    n = len(steps)
    return GraphTime(forward / 1e3 / n, backward / 1e3 / n, sum(ev.cpu_time_total for ev in steps) / 1e3 / n)


def _inside_a_graph(ev: Any) -> bool:
    """Nested in another graph's run (a compiled function called from a compiled region): counted there."""
    parent = ev.cpu_parent
    while parent is not None:
        if parent.name.startswith(_FORWARD_GRAPH) or parent.name == _BACKWARD_GRAPH:
            return True
        parent = parent.cpu_parent
    return False


_NOT_COMPUTE = frozenset(f"turbotrain/{p}" for p in ("data", "h2d", "sync", "eval", "eval_grad", "save"))

POINTWISE = frozenset(
    """add sub mul div neg exp log sigmoid tanh relu gelu silu erf pow sqrt rsqrt abs clamp
where masked_fill threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward mul_ add_
leaky_relu elu hardtanh dropout native_dropout fill zero copy maximum minimum sign reciprocal""".split()
)
