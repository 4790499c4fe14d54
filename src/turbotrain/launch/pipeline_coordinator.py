"""What the Trainer does differently under a pipeline (a RankCoordinator): data sharded over the dp
replicas only, the loss and throughput from the last stage, checkpoints of each process's stages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from .. import distributed as tdist
from ..config import ConfigError
from .trainer_hooks import RankCoordinator, shard_loader

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime import Runtime
    from .pipeline import PipelineRunner

__all__ = ["PipelineCoordinator"]


class PipelineCoordinator(RankCoordinator):
    """RankCoordinator for a pipeline: data sharded over the dp replicas only, the loss and throughput
    from the last stage, checkpoints of each process's stages through torch.distributed.checkpoint."""

    def __init__(self, rt: Runtime) -> None:
        self.pipeline: PipelineRunner = rt.pipeline
        super().__init__(rt.module, rt.optimizers, rt.device)
        self.sharded = self.pipeline.launched

    @property
    def module(self) -> nn.Module:
        return self.pipeline.stage_modules if self.pipeline.launched else self.pipeline.user_model

    @module.setter
    def module(self, value) -> None:  # RankCoordinator.__init__ sets it; the stages decide
        pass

    def shard_loader(self, loader: Any) -> Any:
        runner = self.pipeline
        if loader is None or not runner.launched or runner.layout.dp == 1:
            return loader  # every process of a pipeline reads the same batches
        return shard_loader(loader, replicas=runner.layout.dp, index=runner.dp_rank)

    def _is_last(self) -> bool:
        runner = self.pipeline
        return not runner.launched or runner.layout.stages - 1 in runner.stage_ids

    def reduce_logged(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Mean loss over the last stage's replicas; samples/s summed over them (one rank per pipeline)."""
        if self.world == 1:
            return metrics
        last = self._is_last()
        loss, rate = metrics.get("train_loss"), metrics.get("samples_per_s")
        has_loss, has_rate = last and loss is not None, last and rate is not None
        sums = tdist.all_reduce_sum(
            [
                loss if last and loss is not None else 0.0,
                has_loss,
                rate if last and rate is not None else 0.0,
                has_rate,
            ],
            self.device,
        )
        out = dict(metrics)
        out.pop("train_loss", None)
        out.pop("samples_per_s", None)
        if sums[1]:
            out["train_loss"] = sums[0] / sums[1]
        if sums[3]:
            out["samples_per_s"] = sums[2] * self.pipeline.layout.dp / sums[3]
        return out

    def save_checkpoint(self, state, directory, step, keep):
        # torch.distributed.checkpoint drops some param-group settings (lr, betas, ...) of optimizers whose
        # parameters differ between ranks (torch 2.13): every rank's groups have the same settings, kept here.
        groups = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in self.optimizers]
        return super().save_checkpoint({**state, "param_group_settings": groups}, directory, step, keep)

    def _load(self, path, state) -> None:
        super().load_weights(path, state)
        for opt, groups in zip(self.optimizers, state.get("param_group_settings") or [], strict=False):
            for group, settings in zip(opt.param_groups, groups, strict=True):
                group.update(settings)

    def load_weights(self, path, state) -> None:
        runner = self.pipeline
        if runner.launched and not runner.built:
            if not state.get("sharded"):
                raise ConfigError(
                    f"checkpoint {path} was not written by a pipeline; resume it with the strategy that wrote it."
                )
            runner.pending_load = lambda: self._load(path, state)
            return
        self._load(path, state)
