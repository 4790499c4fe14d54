"""How a pipeline's processes divide (stages, processes per pipeline, FSDP replicas) and the schedule
that runs them (GPipe, 1F1B, interleaved 1F1B, from ``torch.distributed.pipelining``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..config import ConfigError

__all__ = ["Layout", "layout_for", "bubble_fraction", "make_schedule"]


@dataclass(frozen=True)
class Layout:
    """Stages, processes per pipeline (pp) and pipelines (dp, the FSDP replicas)."""

    stages: int
    per_process: int
    pp: int
    dp: int
    microbatches: int
    schedule: str

    @property
    def interleaved(self) -> bool:
        return self.per_process > 1

    def stage_ids(self, pp_rank: int) -> list[int]:
        """The stages a process of the pipeline runs: ``pp_rank``, ``pp_rank + pp``, ... (torch's layout)."""
        return [pp_rank + k * self.pp for k in range(self.per_process)]


def layout_for(plan, world: int) -> Layout:
    """The layout ``plan`` asks for on ``world`` processes; a ConfigError saying why it cannot be."""
    schedule = plan.schedule or "1f1b"
    per = plan.stages_per_process or (2 if schedule == "interleaved-1f1b" else 1)
    stages = plan.pipeline_stages or per * world
    if stages % per:
        raise ConfigError(
            f"Plan.pipeline_stages={stages} with {per} stages per process: the stages must divide "
            "evenly among the processes of a pipeline."
        )
    pp = stages // per
    if pp > world or world % pp:
        raise ConfigError(
            f"Plan.pipeline_stages={stages} at {per} per process needs {pp} processes per pipeline "
            f"(or a multiple of {pp} for pipeline x FSDP), and this run has {world}: launch with "
            f"`turbotrain launch --nproc-per-node {pp} ...`, or change pipeline_stages."
        )
    microbatches = plan.microbatches or stages
    if microbatches < stages:
        raise ConfigError(
            f"Plan.microbatches: {microbatches} micro-batches for {stages} stages; a pipeline needs at "
            "least one micro-batch per stage (more shrinks the bubble)."
        )
    if per > 1 and microbatches % pp:
        raise ConfigError(
            f"Plan.microbatches: the interleaved schedule runs micro-batches in rounds of {pp} (one per "
            f"process); {microbatches} is not a multiple of {pp}."
        )
    return Layout(stages, per, pp, world // pp, microbatches, schedule)


def bubble_fraction(layout: Layout) -> float:
    """The idle share of a step on each process: ``(p - 1) / (v * m + p - 1)`` (v stages per process)."""
    p, m, v = layout.pp, layout.microbatches, layout.per_process
    return (p - 1) / (v * m + p - 1)


def make_schedule(layout: Layout, stages: list[Any], loss_fn: Callable) -> Any:
    """The schedule ``layout`` names over this process's ``stages`` (several of them: interleaved)."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    if layout.interleaved:
        return ScheduleInterleaved1F1B(stages, n_microbatches=layout.microbatches, loss_fn=loss_fn)
    cls = ScheduleGPipe if layout.schedule == "gpipe" else Schedule1F1B
    return cls(stages[0], n_microbatches=layout.microbatches, loss_fn=loss_fn)
