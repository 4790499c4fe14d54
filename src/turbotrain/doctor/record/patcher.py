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
        self.defer(_script_as(new, original))

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


def _script_as(wrapper: Any, original: Any) -> Callable[[], None]:
    """Make TorchScript see ``original`` wherever scripted code names ``wrapper`` (a library that scripts a
    function calling ``torch.tensor`` at import must compile as it does without the doctor); returns the undo.

    A builtin (``torch.tensor``: ``aten::tensor``) is found in TorchScript's table of builtins by the object's
    id, so the wrapper is entered under the same op; a scriptable Python function (``F.softmax``) is compiled
    once and the wrapper mapped to that compilation in TorchScript's cache.
    """
    try:
        from torch.jit import _builtins, _state
    except ImportError:  # pragma: no cover - a torch without TorchScript
        return lambda: None
    op = _builtins._find_builtin(original)
    if op is not None:
        table = _builtins._get_builtin_table()
        table[id(wrapper)] = op

        def undo() -> None:
            if table.get(id(wrapper)) == op:  # keyed by id: an entry left behind could name a later object
                del table[id(wrapper)]

        return undo
    if getattr(original, "__module__", None) == "torch.nn.functional" and callable(original):
        import torch

        try:
            torch.jit.script(original)  # 10-15 ms, once per process: cached by TorchScript itself
            qualified = _state._jit_caching_layer.get(original)
        except Exception:  # noqa: BLE001 - not scriptable: TorchScript would not take it without the doctor either
            qualified = None
        if qualified is not None:
            _state._jit_caching_layer[wrapper] = qualified  # a weak key: gone with the wrapper
    return lambda: None
