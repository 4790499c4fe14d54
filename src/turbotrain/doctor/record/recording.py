"""A finished recording as plain data: what analysis reads, and what one process can send to another.

Frozen, slotted dataclasses of numbers, strings and tuples: no torch object, no callable. A Recording pickles
and round-trips through JSON (:func:`to_json` / :func:`from_json`), so a multi-process job can gather one per
rank. The live objects the what-ifs re-run (the model, a captured batch, the optimizers, the DataLoaders) stay
in the process that recorded them, in :class:`LiveObjects`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from ...data.stats import ReadStats
from ...hardware import LoadSample
from .cadence import PlannedLoop
from .collectives import CommStep
from .compile_watch import CompileFacts
from .graph_watch import GraphGrowth, TensorGrowth
from .measurements import EventCounts, ForwardFacts, LoaderRecord, Phase, StepRecord
from .out_of_memory import OutOfMemory
from .profiling import TopOp
from .watch import WatchedRun
from ..sites import Site

__all__ = [
    "Capture",
    "Recording",
    "Window",
    "ModuleSite",
    "MatmulShape",
    "SiteCount",
    "GpuPhases",
    "LiveObjects",
    "to_json",
    "from_json",
    "SCHEMA_VERSION",
]

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Window:
    """Which steps were warm-up, measured and profiled, and how the window moved while the script ran."""

    warmup: int
    measure: int | None  # measured steps after any extension for periodic work
    asked: int | None  # measured steps asked for
    profile_steps: int
    warmup_extended_by: int = 0  # steps added to drain the batches DataLoader workers queue ahead
    profiled: tuple[int, ...] = ()  # the indices of the steps run under torch.profiler
    profiler_ran: bool = False  # torch.profiler started (the script may have ended inside its first step)
    profile_left_out: int = 0  # the events one step would have made, where the window was left out for them
    cut_for_step_s: float | None = None  # the typical warm-up step, where the window was cut to fit the record budget


@dataclass(frozen=True, slots=True)
class ModuleSite:
    module_id: int  # id() of the module in the recording process
    site: Site  # where the script built it


@dataclass(frozen=True, slots=True)
class MatmulShape:
    site: Site
    a: tuple[int, ...]
    b: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SiteCount:
    site: Site
    count: int


@dataclass(frozen=True, slots=True)
class GpuPhases:
    step: int
    seconds: dict[Phase, float]  # device seconds per phase of that step


@dataclass(frozen=True, slots=True)
class Recording:
    """Everything the doctor's analysis needs from one process's run."""

    window: Window
    steps: tuple[StepRecord, ...]
    step_delimiter: str  # "optimizer.step()", "loss.backward()" or "watch.step()"
    events: tuple[EventCounts, ...]  # per (kind, line): syncs, copies, saves, eval forwards, ...
    loaders: tuple[LoaderRecord, ...]  # the DataLoaders iterated (their ``loader`` is None here)
    optimizer_sites: tuple[Site | None, ...]  # where each optimizer was built, in LiveObjects' order
    module_sites: tuple[ModuleSite, ...]
    matmul_shapes: tuple[MatmulShape, ...]  # operand shapes per user line, from warm-up
    gap_samples: tuple[SiteCount, ...]  # user lines seen running untimed before the forward
    zero_grad_before_backward: int = 0  # zero_grad calls between a step's forward and its backward
    zero_grad_elsewhere: int = 0
    facts: ForwardFacts | None = None  # the trained model's forward, as first measured
    module_calls_per_step: int = 0  # module forward calls of a warm-up step
    profile: dict[str, float] = field(default_factory=dict)  # ops per step and pointwise share (profiler window)
    top_ops: tuple[TopOp, ...] = ()  # the busiest ops of the profiler window
    gpu_phases: tuple[GpuPhases, ...] = ()
    # The user's lines inside functions seen running (warm-up, profiler window) per file; None: not traced.
    ran_lines: dict[str, tuple[int, ...]] | None = None
    load_start: LoadSample | None = None  # the machine's CPU time when the measured window opened
    load_end: LoadSample | None = None
    threads_seen: int | None = None  # torch's intra-op threads then
    reads: ReadStats | None = None  # reads through turbotrain.data over the measured steps
    rank: int = 0
    world_size: int = 1
    host: str = ""
    driver: str = ""  # the framework that stepped the optimizer (record.drivers)
    schema: int = SCHEMA_VERSION
    # The step clock watched after the window, where the loop's cadence reaches beyond it (record/watch.py).
    watched: WatchedRun | None = None
    communication: tuple[CommStep, ...] = ()  # DDP's gradient all-reduces per step (record/collectives.py)
    reducer: dict[str, float] = field(default_factory=dict)  # DDP's own reducer statistics, seconds
    input_numel: dict[int, int] = field(default_factory=dict)  # per step: elements its training forwards took
    # Every rank's recording of a multi-process job (this one included), once the doctor gathered them.
    job: tuple[Recording, ...] = ()
    compiled: CompileFacts | None = None  # what torch.compile did, where the script compiled (record/compile_watch.py)
    # Autograd graphs alive at a few step boundaries off the measured steps (record/graph_watch.py).
    graph_growth: GraphGrowth | None = None
    tensor_growth: TensorGrowth | None = None  # a container of the user's keeping tensors every step (the same)
    out_of_memory: OutOfMemory | None = None  # the script died of it (record/out_of_memory.py)
    # The loop that steps, where its length is read (record/cadence.py): (steps done, reading) at the window's
    # start and end; how far its counter moved between them says how many iterations a step takes.
    planned_loop: tuple[tuple[int, PlannedLoop], ...] = ()

    def gpu_phase_seconds(self) -> dict[int, dict[Phase, float]]:
        return {g.step: dict(g.seconds) for g in self.gpu_phases}

    @property
    def steps_run(self) -> int:
        """The optimizer steps the script ran while recorded: the window's, and those the watch after it saw."""
        watched = self.watched
        return max(len(self.steps), watched.last + 1) if watched is not None and watched.steps else len(self.steps)


@dataclass(eq=False)
class LiveObjects:
    """What only the recording process has: the objects the what-ifs re-run and the trace to export."""

    capture: Any = None  # records.Capture: the outermost trained module and one batch
    optimizers: list[Any] = field(default_factory=list)
    modules: list[Any] = field(default_factory=list)  # every outermost module called in a step
    trained: Any = None  # the outermost module an optimizer updates, when nothing was captured
    eval_grad_inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    loaders: dict[int, Any] = field(default_factory=dict)  # LoaderRecord.key -> the DataLoader
    profiler: Any = None  # torch.profiler.profile of the profiler window
    eager_loss: Any = None  # record.loss_capture.EagerLoss: a loss on a compiled graph's output, outside the graph


@dataclass
class Capture:
    """The outermost trained module and one batch of its inputs, for what-if trials."""

    module: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    batch_size: int
    site: Site | None = None
    batch_dim: int = 0
    unbatched: bool = False  # one sample without a batch dimension: a larger batch stacks copies on a new dim 0
    # The globals of the user's modules whose lines built the batches untimed (the gap sampler's), per file:
    # the batch-building what-if reads the script's own data there.
    namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)


# -- JSON ---------------------------------------------------------------------------------------------------


def to_json(recording: Recording) -> str:
    return json.dumps(_plain(recording), separators=(",", ":"))


def from_json(text: str) -> Recording:
    return typing.cast(Recording, _build(Recording, json.loads(text)))


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _build(hint: Any, value: Any) -> Any:
    """``value`` read back from JSON as the type ``hint`` names (the dataclasses above and their fields)."""
    if value is None or hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _build(options[0], value) if len(options) == 1 else value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = _HINTS.get(hint)
        if hints is None:
            hints = _HINTS[hint] = typing.get_type_hints(hint)
        return hint(**{name: _build(hints[name], v) for name, v in value.items()})
    args = typing.get_args(hint)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in value)
        return tuple(_build(a, v) for a, v in zip(args, value))
    if origin is list:
        return [_build(args[0], v) for v in value]
    if origin is dict:
        key_type = str if typing.get_origin(args[0]) is Literal else args[0]  # a Literal's keys: the strings read
        return {key_type(k): _build(args[1], v) for k, v in value.items()}
    if hint is float:
        return float(value)
    return value
