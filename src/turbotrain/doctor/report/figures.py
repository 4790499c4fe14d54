"""A matplotlib figure as the data URI the HTML report embeds (no external files)."""

from __future__ import annotations

import base64
import io
from typing import Any

__all__ = ["png_uri"]


def png_uri(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
