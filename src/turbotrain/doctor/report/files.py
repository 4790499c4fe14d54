"""Where the doctor writes (``--fix``, ``--json``, ``--html``, ``--trace``): never onto the script, a Python file
or another output, and never through a symlink planted at the path.

:func:`check_outputs` refuses the paths before the script runs; :func:`write_output` writes a fresh file beside the
target and renames it over the path, so a symlink there is replaced rather than followed, and a reader never sees
half a report.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Callable

__all__ = ["check_outputs", "write_output", "write_text"]


def _same(a: str, b: str) -> bool:
    """One file: the same path once symlinks are resolved, or two names (hard links) of one existing file."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False  # one of them does not exist yet


def check_outputs(script: str | None, outputs: dict[str, str | None]) -> None:
    """Raise :class:`~turbotrain.config.ConfigError` when an output (option -> path) would overwrite the script,
    an existing Python file (code the script may import), or another output."""
    from ...config import ConfigError

    named = [(option, path) for option, path in outputs.items() if path]
    for i, (option, path) in enumerate(named):
        if script and _same(path, script):
            raise ConfigError(
                f"doctor {option} {path}: that is the script itself ({script}); writing there would destroy it. "
                f"Give {option} a path of its own, e.g. {option} {_example(option)}."
            )
        if path.endswith(".py") and os.path.isfile(path):
            raise ConfigError(
                f"doctor {option} {path}: that is an existing Python file, which the output would replace; "
                f"give {option} a path of its own, e.g. {option} {_example(option)}."
            )
        for other, other_path in named[:i]:
            if _same(path, other_path):
                raise ConfigError(
                    f"doctor {other} {other_path} and {option} {path} name the same file: one would overwrite "
                    f"the other. Give each its own path, e.g. {other} {_example(other)} {option} {_example(option)}."
                )


def _example(option: str) -> str:
    return {"--fix": "fixes.patch", "--json": "report.json", "--html": "report.html"}.get(option, "trace.json")


def write_output(path: str | os.PathLike, write: Callable[[str], None], nonempty: bool = False) -> None:
    """``write(temporary_path)`` fills a new file in ``path``'s folder, which then replaces ``path``. A symlink at
    ``path`` is replaced, not followed; a folder there, or a folder that does not exist, raises ``OSError``; with
    ``nonempty``, so does a writer that wrote nothing (torch's trace export fails without raising)."""
    target = Path(os.path.abspath(path))
    if target.is_dir() and not target.is_symlink():
        raise IsADirectoryError(21, "Is a directory", str(target))
    # Hidden, and ending as the target does: torch's trace export gzips a path ending in .gz.
    temporary = target.parent / f".tmp-{secrets.token_hex(4)}-{target.name}"
    # O_EXCL|O_NOFOLLOW: a name nobody else has made, and the umask sets the mode as it would for a plain write.
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))
    try:
        write(str(temporary))
        if nonempty and temporary.stat().st_size == 0:
            raise OSError(f"nothing was written to {target}")
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """:func:`write_output` of ``text`` (UTF-8)."""

    def write(temporary: str) -> None:
        with open(temporary, "w", encoding="utf-8") as fh:
            fh.write(text)

    write_output(path, write)
