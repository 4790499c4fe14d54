"""The report's tables of the user's lines: host syncs and host-to-device copies per measured step."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..analysis.context import Context

__all__ = ["SyncRow", "CopyRow", "sync_table", "copy_table"]


# A row's fields, in their order, are its keys in the JSON's syncs and copies (asdict): renaming one changes the
# report's stable surface.


@dataclass(frozen=True)
class SyncRow:
    """The host syncs at one line, per measured step."""

    where: str
    kind: str  # the call that synced: item, bool, format, to_cpu, ...
    per_step: float
    ms_per_step: float
    code: str  # the line's source

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CopyRow:
    """The host-to-device copies at one line, per measured step."""

    where: str
    per_step: float
    mib_per_step: float
    ms_per_step: float
    non_blocking: bool | None  # None: the recording did not say
    pinned: bool | None
    code: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sync_table(ctx: Context) -> list[SyncRow]:
    return [
        SyncRow(
            where=s.site.where(ctx.base),
            kind=s.kind.split(":", 1)[1],
            per_step=round(s.per_step, 3),
            ms_per_step=round(s.seconds_per_step * 1e3, 4),
            code=s.site.code,
        )
        for s in ctx.ran_sites("sync:")
    ]


def copy_table(ctx: Context) -> list[CopyRow]:
    return [
        CopyRow(
            where=s.site.where(ctx.base),
            per_step=round(s.per_step, 3),
            mib_per_step=round(s.bytes_per_step / 2**20, 4),
            ms_per_step=round(s.seconds_per_step * 1e3, 4),
            non_blocking=s.detail.get("non_blocking"),
            pinned=s.detail.get("pinned"),
            code=s.site.code,
        )
        for s in ctx.ran_sites("h2d")
    ]
