"""A package's names imported on first use (PEP 562), so that ``turbotrain --help`` and a mistyped flag answer
in a fraction of a second instead of after importing torch (3-4 s on a small CPU)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy"]


def lazy(
    namespace: dict[str, Any], names: Mapping[str, str], submodules: tuple[str, ...] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: ``names`` maps a name to the module (relative to the package)
    that defines it; each of ``submodules`` is the package's own submodule of that name."""
    package = namespace["__name__"]

    def getattr_(name: str) -> Any:
        if name in submodules:
            value = importlib.import_module(f".{name}", package)
        elif name in names:
            value = getattr(importlib.import_module(names[name], package), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value  # once: the next lookup finds it without this function
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *names, *submodules})

    return getattr_, dir_
