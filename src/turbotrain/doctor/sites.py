"""Where in the user's code something happened: the frame that belongs to their script.

A *user file* is any Python file that is not part of the standard library, an installed
package (site-packages), torch (the code Inductor generates too) or turbotrain. Findings point
at ``file:line`` of such a frame so the user lands on their own code, never inside a library.
Installed means any ``site-packages`` or ``dist-packages`` folder, not only this interpreter's: the user's own
(``pip install --user``), a distribution's, or one put on ``PYTHONPATH``; and, anywhere else
on ``sys.path`` (``pip install --target``), the files an installed distribution's RECORD lists
(an editable install lists none of its sources: they stay the user's).
"""

from __future__ import annotations

import linecache
import os
import site
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Iterable

__all__ = ["Site", "is_user_file", "user_site", "caller_site", "raised_at", "relative_where", "source_lines"]


def _library_roots() -> tuple[str, ...]:
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
    import torch

    import turbotrain

    # Old virtualenvs' site module has no getsitepackages: their packages are under purelib above anyway.
    for path in [*getattr(site, "getsitepackages", list)(), site.getusersitepackages()]:
        roots.add(os.path.realpath(path))
    roots.add(os.path.realpath(os.path.dirname(torch.__file__)))
    roots.add(os.path.realpath(os.path.dirname(turbotrain.__file__)))
    roots |= _installed_elsewhere(roots)
    return tuple(sorted(roots, key=len, reverse=True))


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def _installed_elsewhere(roots: set[str]) -> set[str]:
    """The package folders and modules that distributions installed outside ``roots`` put there, from their
    RECORD (``pip install --target DIR``, with DIR on ``PYTHONPATH``): installed code, wherever it lives."""
    from importlib import metadata

    found = set()
    for dist in metadata.distributions():
        location = os.path.realpath(str(dist.locate_file("")))
        # Only a dist-info RECORD lists what was installed (an egg-info's SOURCES.txt lists a project's sources).
        if _under(location, roots) or dist.read_text("RECORD") is None:
            continue
        for file in dist.files or ():
            top = file.parts[0]  # a package's folder, or a module
            if top == ".." or top.endswith((".dist-info", ".data")) or (len(file.parts) == 1 and top[-3:] != ".py"):
                continue  # scripts put in bin/, the record itself
            found.add(os.path.join(location, top))
    return found


_ROOTS: tuple[str, ...] | None = None
_INSTALLED = frozenset({"site-packages", "dist-packages"})  # where installers put packages, on any prefix
USER_FILES: dict[str, bool] = {}  # filename -> user code? (a dict: this sits on hot paths)


def is_user_file(filename: str) -> bool:
    """Whether ``filename`` (a code object's co_filename) is the user's code."""
    known = USER_FILES.get(filename)
    if known is not None:
        return known
    global _ROOTS
    if not filename or filename.startswith("<"):
        answer = False  # <frozen ...>, <string>, <stdin>: nothing to point at
    else:
        if _ROOTS is None:
            _ROOTS = _library_roots()
        path = os.path.realpath(filename)
        answer = not _under(path, _ROOTS) and not any(folder in _INSTALLED for folder in Path(path).parts)
        answer = answer and not _under(path, (_inductor_cache(),))
    USER_FILES[filename] = answer
    return answer


def _inductor_cache() -> str:
    """Where Inductor writes the Python it generates (a compiled graph's ``call``, where an out-of-memory error of a
    compiled model is raised): torch's code, not the user's. Read each time, as torch reads it: a script or a test
    may point ``TORCHINDUCTOR_CACHE_DIR`` elsewhere while it runs."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.realpath(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir())


@dataclass(frozen=True)
class Site:
    """One line of user code."""

    file: str
    line: int
    function: str = ""

    def where(self, base: str | None = None) -> str:
        return f"{relative_where(self.file, base)}:{self.line}"

    @property
    def code(self) -> str:
        return linecache.getline(self.file, self.line).strip()


def user_site(frame: FrameType | None, max_depth: int = 64) -> Site | None:
    """The innermost user frame at or above ``frame``."""
    depth = 0
    while frame is not None and depth < max_depth:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return Site(code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
        depth += 1
    return None


def raised_at(tb: TracebackType | None) -> Site | None:
    """The innermost line of the user's code an error was raised under (its traceback's); None where none is.

    A function torch.compile compiled runs as Dynamo's bytecode in a frame of the function's own code, at its first
    line (its ``def`` or decorator) while its graph runs: such a frame is passed over for its caller's line (the
    call of the compiled model), since no line of its body is the one that ran."""
    site = None
    while tb is not None:
        code = tb.tb_frame.f_code
        calls_graph = tb.tb_lineno == code.co_firstlineno and tb.tb_next is not None and _in_dynamo(tb.tb_next)
        if is_user_file(code.co_filename) and not calls_graph:
            site = Site(code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return site


def _in_dynamo(tb: TracebackType) -> bool:
    return f"{os.sep}torch{os.sep}_dynamo{os.sep}" in tb.tb_frame.f_code.co_filename


def caller_site(frame: FrameType | None) -> Site | None:
    """``frame`` itself when it is user code, else None (the call came from a library)."""
    if frame is None:
        return None
    known = USER_FILES.get(frame.f_code.co_filename)
    if known is False or (known is None and not is_user_file(frame.f_code.co_filename)):
        return None
    return Site(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def relative_where(filename: str, base: str | None = None) -> str:
    """``filename`` relative to ``base`` (the script's folder) or the working directory when inside."""
    path = Path(filename).resolve()
    for root in (base, os.getcwd()):
        if root:
            try:
                return str(path.relative_to(Path(root).resolve()))
            except ValueError:
                continue
    return str(path)


def source_lines(filename: str, line: int, context: int = 2) -> list[tuple[int, str]]:
    """``(number, text)`` for the lines around ``line`` (for reports that show the code)."""
    first = max(1, line - context)
    out = []
    for n in range(first, line + context + 1):
        text = linecache.getline(filename, n)
        if not text and n > line:
            break
        out.append((n, text.rstrip("\n")))
    return out
