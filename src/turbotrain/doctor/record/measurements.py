"""What a recording measured, as frozen plain data: steps with time per phase, events per line, the
DataLoaders and the trained model's forward. The breakdown and the rules read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, get_args

from ..findings import Category
from ..sites import Site

__all__ = [
    "Category",
    "CATEGORIES",
    "Phase",
    "MemoryPhase",
    "PHASE_CATEGORY",
    "StepRecord",
    "EventCounts",
    "LoaderRecord",
    "ForwardFacts",
]

# The breakdown's categories, in the order the report shows them (and its JSON holds them).
CATEGORIES: tuple[Category, ...] = get_args(Category)

# The phases the recorder's clock times a step in (record/clock.py): the keys of PHASE_CATEGORY.
Phase = Literal["data", "h2d", "forward", "backward", "optimizer", "update", "sync", "eval", "eval_grad", "save"]

# The part of a training step the memory watch finds its peak in (record/memory_watch.py), and an out-of-memory
# error's (record/out_of_memory.py): coarser than Phase, from what ran rather than from the clock.
MemoryPhase = Literal["forward", "backward", "optimizer"]

# Phases the recorder times (exclusive time: a sync inside forward counts as host_sync only).
PHASE_CATEGORY: dict[Phase, Category] = {
    "data": "data_loading",  # waiting on a DataLoader iterator
    "h2d": "host_to_device",  # .to(device) / .cuda() copies from host memory
    "forward": "compute",  # the outermost module calls of the training step
    "backward": "compute",  # torch.autograd.backward / grad
    "optimizer": "optimizer",  # optimizer.step and zero_grad
    "update": "optimizer",  # no optimizer: from the end of the backward to the next step (the update)
    "sync": "host_sync",  # .item(), .cpu(), .tolist(), print/format of a tensor, bool(tensor)
    "eval": "outside_step",  # forward of the trained model under no_grad or in eval mode
    "eval_grad": "outside_step",  # eval-mode forward with autograd on that no backward followed
    "save": "outside_step",  # torch.save
}


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One optimizer step: from the end of the previous step to the end of this one."""

    index: int
    start: float
    end: float
    phases: dict[Phase, float]  # exclusive seconds per phase
    gap_before_forward: float = 0.0  # untimed seconds before the step's first training forward
    forwards: int = 0  # outermost training forwards
    backwards: int = 0
    optimizers: int = 0  # optimizer.step calls in this step
    module_calls: int = 0  # module forward calls with autograd on (counted during warm-up only)
    profiled: bool = False  # under torch.profiler (its own overhead): not in the statistics
    preempted: float | None = None  # seconds the thread waited for a CPU another process held (Linux)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def untimed(self) -> float:
        return max(0.0, self.duration - sum(self.phases.values()))

    def categories(self) -> dict[Category, float]:
        """Seconds per breakdown category; sums to :attr:`duration`.

        Time no hook saw is split at the step's first training forward: before it the script
        was preparing the next batch (a generator, indexing pre-built tensors: data loading);
        after it, it was computing the loss and glue between the timed calls (compute).
        """
        out = dict.fromkeys(CATEGORIES, 0.0)
        for phase, seconds in self.phases.items():
            out[PHASE_CATEGORY[phase]] += seconds
        untimed = self.untimed
        before = min(untimed, self.gap_before_forward) if self.forwards else 0.0
        out["data_loading"] += before
        out["compute"] += untimed - before
        scale = self.duration / sum(out.values()) if sum(out.values()) > 0 else 0.0
        if abs(scale - 1.0) > 1e-9 and scale > 0:
            # Clock granularity can make timed phases exceed the step by nanoseconds.
            out = {k: v * scale for k, v in out.items()}
        return out


@dataclass(frozen=True, slots=True)
class EventCounts:
    """One kind of event at one line, per step: (step, count, seconds, bytes) for each step it happened in."""

    kind: str
    site: Site | None
    cells: tuple[tuple[int, int, float, int], ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)  # what the first event looked like (a shape, a flag)

    @property
    def by_step(self) -> dict[int, tuple[int, float, int]]:
        return {step: (count, seconds, nbytes) for step, count, seconds, nbytes in self.cells}

    def total(self, steps: Iterable[int]) -> tuple[int, float, int]:
        wanted = steps if isinstance(steps, (set, frozenset, range, dict)) else set(steps)
        count, seconds, nbytes = 0, 0.0, 0
        for step, c, s, b in self.cells:
            if step in wanted:
                count += c
                seconds += s
                nbytes += b
        return count, seconds, nbytes

    def per_step(self, steps: list[int]) -> tuple[float, float, float]:
        """Average (count, seconds, bytes) per step over ``steps``."""
        if not steps:
            return 0.0, 0.0, 0.0
        count, seconds, nbytes = self.total(steps)
        return count / len(steps), seconds / len(steps), nbytes / len(steps)


@dataclass(frozen=True, slots=True)
class LoaderRecord:
    """A DataLoader the script iterated, as recorded; ``loader`` is the live object (None in a Recording)."""

    key: int  # id() of the DataLoader in the recording process
    site: Site | None
    settings: dict[str, Any]
    nexts: EventCounts  # batches fetched and seconds waited, per step
    starts: tuple[tuple[int, float], ...] = ()  # (step, seconds to the first batch) per iter()
    loader: Any = None  # kept alive: the num_workers what-if re-times it after the script


@dataclass(frozen=True, slots=True)
class ForwardFacts:
    """What the first measured training forward of the trained model looked like."""

    module_type: str = ""
    device: str = "cpu"
    param_dtype: str = "torch.float32"
    autocast: bool = False
    autocast_dtype: str | None = None
    compiled: bool = False
    input_shapes: tuple[tuple[int, ...], ...] = ()
    input_channels_last: bool = False
    # Conv weights in channels_last: torch's convolution then computes NHWC whatever layout its input has.
    weights_channels_last: bool = False
    batch_size: int | None = None
    batch_dim: int = 0  # 1 for an RNN fed [seq, batch, ...] (no batch_first)
    cudnn_benchmark: bool = False
    unbatched: bool = False  # one sample with no batch dimension (a policy fed one state): batch_size 1
    whole_graph: bool = False  # the rows are a graph's nodes, all of them (an [N, N] adjacency or an edge index)
