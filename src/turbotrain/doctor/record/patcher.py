"""Replacing attributes of torch for the duration of a recording, and putting them back exactly."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["Patcher"]

_MISSING = object()


class Patcher:
    """``replace(owner, name, make)`` installs ``make(original)``; ``restore()`` undoes all, newest first.

    An attribute that was inherited (not in ``owner.__dict__``) is deleted again on restore,
    so ``torch.Tensor.item`` goes back to resolving through its C base class.
    """

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def replace(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        own = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name, _MISSING)
        original = getattr(owner, name)
        self._saved.append((owner, name, own))
        new = make(original)
        if isinstance(own, (staticmethod, classmethod)):
            new = type(own)(new)
        setattr(owner, name, new)

    def defer(self, undo: Callable[[], Any]) -> None:
        """Call ``undo`` on restore, in its turn: for a change that is not an attribute (a hook's handle)."""
        self._saved.append((None, "", undo))

    def put(self, owner: Any, name: str, value: Any) -> None:
        """``owner.name = value`` until restore (a replacement that does not wrap the original)."""
        self.replace(owner, name, lambda _original: value)

    def restore(self) -> None:
        while self._saved:
            owner, name, own = self._saved.pop()
            if owner is None:
                own()
            elif own is _MISSING:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
            else:
                setattr(owner, name, own)
