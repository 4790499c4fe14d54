"""Typed dataclass configuration with errors that name the bad key and what is allowed.

Every user-facing configuration object (the Plan, recipes, trainer limits) is a dataclass
decorated with :func:`strict`. Two things follow:

* ``Cls(unknwon=1)`` and ``from_mapping(Cls, {"unknwon": 1})`` raise :class:`ConfigError`
  naming the key, the closest valid key, and every allowed key;
* each field's value is checked against its annotation (``Literal`` choices, ``bool``,
  ``int``, ``float``, ``str``, ``Optional``/unions, nested dataclasses, lists), so
  ``Plan(precision="bf16")`` says which precisions exist.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import re
import textwrap
import reprlib
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

__all__ = ["ConfigError", "strict", "from_mapping", "to_mapping", "describe_type", "field_docs", "parse_size"]


class ConfigError(ValueError):
    """A configuration value or key is wrong. The message says where and what is allowed."""


_T = TypeVar("_T")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])i?b?|b)?\s*$", re.IGNORECASE)


def parse_size(text: str | int, what: str) -> int:
    """Bytes from ``4194304``, ``4M``, ``4MiB``, ``1.5GiB`` or ``512k`` (binary units). ``what`` names the value
    in the error: ``NCCL buffer size``, ``--memory-limit``."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise ConfigError(f"{what} {text!r} is not a size; give bytes (4194304) or 4M / 4MiB / 1.5GiB / 512K.")
    scale = 2 ** (10 * " kmgt".index((match.group(2) or " ").lower()))
    return int(float(match.group(1)) * scale)


# Values are quoted in errors at a bounded length: nine levels of YAML aliases stand for 9**9
# items and a plain repr would spell out every one of them.
_repr = reprlib.Repr()  # attributes, not keywords: Repr(maxlevel=...) needs Python 3.12
_repr.maxlevel, _repr.maxlist, _repr.maxtuple, _repr.maxdict, _repr.maxstring, _repr.maxother = 2, 6, 6, 6, 80, 80
_quote = _repr.repr


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string right under its annotation, as the Plan writes them), on one line."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _field_names(cls: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


def _unknown_key_message(where: str, key: object, allowed: list[str]) -> str:
    close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return f"{where}.{key}: unknown key '{key}'.{hint} Allowed keys: {', '.join(allowed)}."


def describe_type(tp: Any) -> str:
    """Human wording of what an annotation accepts, for error messages."""
    origin = get_origin(tp)
    if tp is Any:
        return "any value"
    if tp is type(None):
        return "null"
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in get_args(tp))
    if origin in (list, tuple):
        args = get_args(tp)
        inner = describe_type(args[0]) if args else "values"
        return f"a list of {inner}"
    if origin in (dict, Mapping):
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return f"a mapping with keys {', '.join(_field_names(tp))}"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Return ``value`` converted to ``tp`` or raise ConfigError naming ``where``."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if tp is type(None):
        if value is None:
            return None
    elif origin is Literal:
        for choice in get_args(tp):
            # `True == 1` in Python: compare types too so 1 is not accepted for True.
            if value == choice and type(value) is type(choice):
                return value
    elif origin in (Union, types.UnionType):
        for arg in get_args(tp):
            try:
                return _coerce(value, arg, where)
            except ConfigError as exc:
                if not str(exc).startswith(f"{where}:"):
                    raise  # the value had the right shape but a key inside it is wrong: say that
                continue
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            args = get_args(tp)
            item_tp = args[0] if args else Any
            items = [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
            return tuple(items) if origin is tuple else items
    elif origin in (dict, Mapping) or tp is dict:
        if isinstance(value, Mapping):
            return dict(value)
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):  # an annotation is a class, never an instance
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return from_mapping(tp, value, where)
    else:  # a plain class annotation
        if isinstance(value, tp):
            return value
    raise ConfigError(f"{where}: {_quote(value)} is not allowed; expected {describe_type(tp)}.")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    # Resolving string annotations costs milliseconds; a class's hints never change.
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def validate_fields(obj: Any) -> None:
    """Check (and normalise, e.g. int -> float) every field of a dataclass instance."""
    cls = type(obj)
    hints = _hints(cls)
    for name in _field_names(cls):
        value = getattr(obj, name)
        checked = _coerce(value, hints[name], f"{cls.__name__}.{name}")
        if checked is not value:
            object.__setattr__(obj, name, checked)  # works for frozen dataclasses too


def strict(cls: type[_T]) -> type[_T]:
    """Class decorator: unknown keyword arguments and mistyped values raise ConfigError."""
    init = cls.__init__
    allowed = _field_names(cls)
    allowed_set = set(allowed)

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for key in kwargs:
            if key not in allowed_set:
                raise ConfigError(_unknown_key_message(cls.__name__, key, allowed))
        init(self, *args, **kwargs)
        validate_fields(self)
        check = getattr(self, "_check", None)
        if check is not None:
            check()

    cls.__init__ = __init__  # type: ignore[method-assign]  # the decorator's point: wrap the dataclass's __init__
    return cls


def from_mapping(cls: type[_T], data: Any, where: str | None = None) -> _T:
    """Build dataclass ``cls`` from a mapping (parsed YAML/JSON), naming bad keys and values."""
    where = where or cls.__name__
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{where}: expected a mapping with keys {', '.join(_field_names(cls))}, "
            f"got {type(data).__name__} {_quote(data)}."
        )
    allowed = _field_names(cls)
    hints = _hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in allowed:
            raise ConfigError(_unknown_key_message(where, key, allowed))
        kwargs[key] = _coerce(value, hints[key], f"{where}.{key}")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        # Re-anchor messages raised by __post_init__ checks at the mapping's location.
        raise ConfigError(str(exc).replace(f"{cls.__name__}.", f"{where}.", 1)) from None


def to_mapping(obj: Any) -> dict[str, Any]:
    """Plain-data view of a (nested) dataclass: the inverse of :func:`from_mapping`."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            value = to_mapping(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out
