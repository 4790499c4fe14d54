"""Which RankCoordinator a Runtime gets: a pipeline's own, or the one for DDP, FSDP and a single process."""

from __future__ import annotations

from ..runtime import Runtime
from .pipeline_coordinator import PipelineCoordinator
from .trainer_hooks import RankCoordinator

__all__ = ["coordinator_for"]


def coordinator_for(rt: Runtime) -> RankCoordinator:
    """The Trainer's distributed behaviour for ``rt`` (a pass-through in a single process)."""
    if rt.pipeline is not None:
        return PipelineCoordinator(rt)
    return RankCoordinator(rt.module, rt.optimizers, rt.device)
