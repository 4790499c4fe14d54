"""What a Trainer checkpoint holds, and resuming from one: weights, optimizers, schedulers, the
Runtime's own state, early stopping, the data stream's exact position and the Trainer's counters.

Files are written and read by ``train/checkpoint.py`` (complete or absent); across processes
through the launch's ``RankCoordinator`` (rank 0 commits, FSDP shards, each rank's position).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..launch.trainer_hooks import RankCoordinator
from ..plan import Plan
from ..runtime import Runtime
from . import checkpoint as ckpt
from . import rng
from .config import TrainerConfig
from .early_stopping import EarlyStopping
from .resumable import EpochSource, Position
from .state import TrainState

__all__ = ["TrainerCheckpoints"]

log = logging.getLogger("turbotrain")

_KEYS = ("step", "position", "model", "optimizers", "schedulers", "runtime", "early_stopping", "trainer")
_TRAINER_KEYS = ("samples", "skipped_steps", "elapsed_s", "early_stop")


class TrainerCheckpoints:
    """A Trainer's checkpoints: what goes in, where they are written, the last one written or resumed."""

    def __init__(
        self,
        rt: Runtime,
        ranks: RankCoordinator,
        plan: Plan,
        schedulers: list,
        early_stopping: EarlyStopping | None,
        config: TrainerConfig,
    ):
        self.rt, self.ranks, self.plan = rt, ranks, plan
        self.schedulers, self.early_stopping = schedulers, early_stopping
        self.config = config  # checkpoint_dir and keep_checkpoints, read when used
        if config.checkpoint_dir:  # another user's folder is refused now, not at the first checkpoint hours later
            ckpt.own_directory(config.checkpoint_dir, create=False)
        self.last_step = -1  # the step of the last checkpoint written or resumed from
        self.last_path: str | None = None

    def state_dict(
        self, state: TrainState, source: EpochSource, elapsed_s: float, at_epoch_end: bool
    ) -> dict[str, Any]:
        """Everything resuming needs; ``elapsed_s`` is the training time up to now, earlier runs included."""
        gens = source.generators
        if at_epoch_end:
            position = Position(
                epoch=state.epoch,
                batches_done=0,
                rng=rng.capture(gens),
                epoch_rng=None,
                iterator_reused=source.next_epoch_reuses_iterator(),
                batch_size=source.batch_size,
            )
        else:
            position = Position(
                epoch=state.epoch,
                batches_done=state.batches_done,
                rng=rng.capture(gens),
                epoch_rng=source.epoch_rng,
                iterator_reused=source.epoch_reused,
                batch_size=source.batch_size,
            )
        return {
            "format": ckpt.FORMAT,
            "step": state.step,
            "position": vars(position),
            "model": self.rt.module.state_dict(),
            "optimizers": [opt.state_dict() for opt in self.rt.optimizers],
            "schedulers": [sched.state_dict() for sched in self.schedulers],
            "runtime": self.rt.state_dict(),
            "early_stopping": self.early_stopping.state_dict() if self.early_stopping else None,
            "trainer": {
                "samples": state.samples,
                "skipped_steps": state.skipped_steps,
                "elapsed_s": elapsed_s,
                "early_stop": state.early_stop,
            },
            "plan": self.plan.to_dict(),
        }

    def save(self, state_dict: dict[str, Any], step: int) -> None:
        # distributed: every rank calls it (positions, FSDP shards); rank 0 commits; all wait for the commit
        directory: str = self.config.checkpoint_dir  # type: ignore[assignment]  # set when fit() saves at all
        path = self.ranks.save_checkpoint(state_dict, directory, step, self.config.keep_checkpoints)
        if path is not None:
            self.last_path = str(path)
        self.last_step = step

    def resume(self, source: EpochSource) -> tuple[TrainState, Position] | None:
        """Load the latest complete checkpoint into the model, optimizers, schedulers and Runtime; the
        Trainer's counters and this rank's data position (for ``source``) from it. None when there is none yet.

        Everything is checked against this run before anything changes: a checkpoint that does not fit
        is a CheckpointMismatchError that says what differs, and the run is as it was.
        """
        directory = self.config.checkpoint_dir
        if not directory:
            raise ConfigError("fit(resume=True) needs Trainer(checkpoint_dir=...) to know where checkpoints are.")
        found = self.ranks.find_checkpoint(directory)  # distributed: rank 0 chooses, every rank loads the same
        if found is None:
            log.info("turbotrain: no complete checkpoint in %s; starting from scratch", directory)
            return None
        path, saved = found
        pos = self._position(path, saved, source)
        self.ranks.load_weights(path, saved)  # checks the weights against this run first; FSDP shards via DCP
        for sched, sched_state in zip(self.schedulers, saved["schedulers"], strict=True):
            sched.load_state_dict(sched_state)
        self.rt.load_state_dict(saved["runtime"])
        if self.early_stopping is not None and saved["early_stopping"]:
            self.early_stopping.load_state_dict(saved["early_stopping"])
        extra = saved["trainer"]
        state = TrainState(
            step=saved["step"],
            epoch=pos.epoch,
            batches_done=pos.batches_done,
            samples=extra["samples"],
            skipped_steps=extra["skipped_steps"],
            elapsed_s=extra["elapsed_s"],
            early_stop=extra["early_stop"],
        )
        self.last_step, self.last_path = saved["step"], str(path)
        log.info(
            "turbotrain: resumed from %s (step %d, epoch %d, batch %d)", path, state.step, pos.epoch, pos.batches_done
        )
        return state, pos

    def _position(self, path: Path, saved: dict[str, Any], source: EpochSource) -> Position:
        """Everything resuming reads besides the weights, checked against this run; where ``source`` starts."""
        extra = saved["trainer"] if isinstance(saved.get("trainer"), dict) else {}
        missing = [k for k in _KEYS if k not in saved] or [f"trainer.{k}" for k in _TRAINER_KEYS if k not in extra]
        if missing:
            raise ckpt.CheckpointMismatchError(
                path, [f"it lacks {', '.join(missing)}: it was not written by a turbotrain Trainer"]
            )
        problems = []
        try:
            schedulers, stopping = saved["schedulers"], saved["early_stopping"]
            if len(schedulers) != len(self.schedulers):
                problems.append(f"it holds {len(schedulers)} scheduler(s), this run has {len(self.schedulers)}")
            if self.early_stopping is not None and stopping and set(stopping) != set(self.early_stopping.state_dict()):
                problems.append(f"its early-stopping state has {sorted(stopping)}, this run's EarlyStopping other keys")
            pos = Position(**self.ranks.position(saved))  # distributed: this rank's own stream
            pos = source.resume_position(pos, self.rt.accum_steps)
        except (TypeError, KeyError, IndexError, AttributeError) as exc:
            problems.append(f"its data position or counters are not what this version reads ({exc!r})")
        except ValueError as exc:
            problems.append(str(exc))
        if problems:
            raise ckpt.CheckpointMismatchError(path, problems)
        return pos
