"""The report's tables of the user's lines: host syncs and host-to-device copies per measured step."""

from __future__ import annotations

from typing import Any

from ..analysis.context import Context

__all__ = ["sync_table", "copy_table"]


def sync_table(ctx: Context) -> list[dict[str, Any]]:
    return [
        {
            "where": ctx.where(s.site),
            "kind": s.kind.split(":", 1)[1],
            "per_step": round(s.per_step, 3),
            "ms_per_step": round(s.seconds_per_step * 1e3, 4),
            "code": s.site.code,
        }
        for s in ctx.ran_sites("sync:")
    ]


def copy_table(ctx: Context) -> list[dict[str, Any]]:
    return [
        {
            "where": ctx.where(s.site),
            "per_step": round(s.per_step, 3),
            "mib_per_step": round(s.bytes_per_step / 2**20, 4),
            "ms_per_step": round(s.seconds_per_step * 1e3, 4),
            "non_blocking": s.detail.get("non_blocking"),
            "pinned": s.detail.get("pinned"),
            "code": s.site.code,
        }
        for s in ctx.ran_sites("h2d")
    ]
