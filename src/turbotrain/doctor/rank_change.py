"""A fix applied on every rank of a job while the doctor times it: the job what-ifs' one lever.

The doctor re-runs the user's launcher with a :class:`RankChange` in the ranks' options (job/launcher.py); each
rank applies it (:func:`.apply.change.apply_change`) before its script starts, so every rank trains with
the fix, in lockstep, exactly as the user would after making it. Plain data: a rule asks for one
(:class:`.requests.JobRequest`), the job what-if (:mod:`.whatif.job`) times it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["RankChange"]


@dataclass(frozen=True)
class RankChange:
    """What every rank does differently in a timed run. Unset fields leave the script as it is."""

    threads: int | None = None  # torch's intra-op threads (and OMP_NUM_THREADS), whatever the script sets
    ddp: dict[str, Any] = field(default_factory=dict)  # keyword arguments forced on every DistributedDataParallel
    sync_every: int | None = None  # one gradient sync (DDP or FSDP) per this many backward passes
    autocast: str | None = None  # "bfloat16": every DistributedDataParallel forward under torch.autocast
    autocast_off: str | None = None  # "bfloat16"/"float16": every torch.autocast in that dtype built disabled
    save_every: int | None = None  # torch.save writes on one call in this many (the others return at once)
    save_at: str | None = None  # "file:line": only the torch.save calls from this user line (None: every call)
    branch_every: int | None = None  # the ``if`` at branch_at runs its body on one in this many passes it allows
    branch_at: str | None = None  # "file:line" of that ``if``, in the script the ranks run
    loader_workers: int | None = None  # every DataLoader built with this many (persistent) worker processes
    # Keyword arguments forced on every fully_shard call (reshard_after_forward=False: the older
    # FullyShardedDataParallel's full sharding becomes SHARD_GRAD_OP, its equivalent).
    fsdp: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"RankChange.threads must be 1 or more, not {self.threads}")
        if self.sync_every is not None and self.sync_every < 2:
            raise ValueError(f"RankChange.sync_every must be 2 or more, not {self.sync_every}")
        if self.save_every is not None and self.save_every < 2:
            raise ValueError(f"RankChange.save_every must be 2 or more, not {self.save_every}")
        if self.branch_every is not None and (self.branch_every < 2 or not self.branch_at):
            raise ValueError(
                f"RankChange.branch_every must be 2 or more, with branch_at, not {self.branch_every} at "
                f"{self.branch_at!r}"
            )
        if self.loader_workers is not None and self.loader_workers < 1:
            raise ValueError(f"RankChange.loader_workers must be 1 or more, not {self.loader_workers}")
        if self.autocast not in (None, "bfloat16", "float16"):
            raise ValueError(f"RankChange.autocast must be 'bfloat16' or 'float16', not {self.autocast!r}")
        if self.autocast_off not in (None, "bfloat16", "float16"):
            raise ValueError(f"RankChange.autocast_off must be 'bfloat16' or 'float16', not {self.autocast_off!r}")

    @property
    def changes_cadence(self) -> bool:
        """Work made rarer (saves, a branch): the job's steps then differ one from the next, and compare by mean."""
        return self.save_every is not None or self.branch_every is not None

    def describe(self) -> str:
        """``torch.set_num_threads(1)``, ``DistributedDataParallel(..., find_unused_parameters=False)``, ..."""
        parts = []
        if self.threads is not None:
            parts.append(f"torch.set_num_threads({self.threads})")
        if self.ddp:
            args = ", ".join(f"{k}={v!r}" for k, v in self.ddp.items())
            parts.append(f"DistributedDataParallel(..., {args})")
        if self.sync_every is not None:
            parts.append(
                f"no gradient sync (DDP's no_sync(), FSDP's set_requires_gradient_sync(False)) on "
                f"{self.sync_every - 1} of every {self.sync_every} backward passes"
            )
        if self.autocast is not None:
            parts.append(f"torch.autocast(dtype=torch.{self.autocast}) around the model's forward")
        if self.autocast_off is not None:
            parts.append(f"torch.autocast(..., dtype=torch.{self.autocast_off}, enabled=False)")
        if self.save_every is not None:
            where = f" at {os.path.basename(self.save_at)}" if self.save_at else ""
            parts.append(f"torch.save{where} on one call in {self.save_every}")
        if self.loader_workers is not None:
            parts.append(f"DataLoader(..., num_workers={self.loader_workers}, persistent_workers=True)")
        if self.fsdp:
            zero2 = self.fsdp.get("reshard_after_forward") is False
            older = " (FullyShardedDataParallel: SHARD_GRAD_OP)" if zero2 else ""
            parts.append(f"fully_shard(..., {', '.join(f'{k}={v!r}' for k, v in self.fsdp.items())}){older}")
        if self.branch_every is not None and self.branch_at:
            parts.append(f"the `if` at {os.path.basename(self.branch_at)} taken on one pass in {self.branch_every}")
        return "; ".join(parts) or "no change"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankChange:
        return cls(**data)
