"""One safe YAML reader for plans and recipes: plain data only, and a key given twice is an error."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError

__all__ = ["load_yaml"]


class _StrictLoader(yaml.SafeLoader):
    """``yaml.safe_load``, except that a key given twice is an error (PyYAML keeps the last one)."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *defaults` then overriding a key is how merges are meant to be used
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:
            continue  # unhashable: construct_mapping reports it
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def load_yaml(path_or_text: str | os.PathLike) -> tuple[Any, str]:
    """Parse a YAML file (or YAML text) safely; returns (data, a name for error messages)."""
    text, where = None, "<yaml>"
    candidate = Path(path_or_text)
    looks_like_a_path = "\n" not in str(path_or_text) and candidate.suffix in (".yaml", ".yml")
    if isinstance(path_or_text, os.PathLike) or looks_like_a_path:
        if not candidate.is_file():
            raise ConfigError(f"{candidate}: no such file.")
        text, where = candidate.read_text(), str(candidate)
    else:
        text = str(path_or_text)
    try:
        return yaml.load(text, Loader=_StrictLoader), where  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(
            f"{where}{at}: not valid YAML for turbotrain: {problem}. "
            "Only plain mappings, lists, strings and numbers are accepted."
        ) from None
