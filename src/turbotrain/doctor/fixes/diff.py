"""The patch: each fix as a unified diff (difflib) against the user's files, paths relative to the script's
folder, checked to compile; the fixes kept combined into one ``git apply``-able file with a header.

Fixes are combined one after another on the text the previous ones left, each finding its lines
through the earlier edits (a line map from the diff so far), so two fixes in one file never fight
over line numbers.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path

from ..report.files import write_text
from .model import ByHand, EditRequest
from ..report.fix_results import FixResult
from .table import apply_edit

__all__ = ["PatchError", "make_diffs", "combine", "unified_diff", "render_patch", "check_compiles", "write_patch"]


class PatchError(RuntimeError):
    """The patch would break the script (it does not compile): nothing is written."""


def _read(path: str, cache: dict[str, str]) -> str:
    if path not in cache:
        cache[path] = Path(path).read_text(encoding="utf-8")
    return cache[path]


def check_compiles(text: str, name: str) -> None:
    """Compile ``text`` as the file ``name`` would be: the patched script must at least import-check."""
    try:
        compile(text, name, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise PatchError(f"the patched {name} does not compile: {exc.msg} at line {exc.lineno}") from exc


def unified_diff(old: str, new: str, relpath: str) -> str:
    """A ``git apply``-able diff of one file (``a/`` and ``b/`` prefixes, ``\\ No newline`` markers)."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=f"a/{relpath}", tofile=f"b/{relpath}"
    )
    out = []
    for line in lines:
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


def _line_code(path: str, line: int, cache: dict[str, str]) -> str:
    lines = _read(path, cache).splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def _by_hand_text(request: EditRequest, reason: str, cache: dict[str, str]) -> str:
    """The reason, without a leading ``where:`` (the header says where), and the line to change."""
    reason = reason.removeprefix(f"{request.where}: ")
    code = _line_code(request.file, request.line, cache)
    return f"{reason} (line {request.where}: `{code}`)" if code else reason


def make_diffs(results: list[FixResult], base: str) -> dict[str, str]:
    """Each fix alone against the original (its ``diff``; where its edit cannot be made, the edit its rule makes
    instead, saying so), or why it is by hand; the originals read, by path."""
    originals: dict[str, str] = {}
    for result in results:
        request = result.request
        if request is None:
            continue
        tried: list[tuple[str, str]] = []  # the edits that could not be made: their kind, and why
        while request is not None:
            name = os.path.relpath(request.file, base)
            try:
                new = apply_edit(_read(request.file, originals), request, name)
                check_compiles(new, name)
                break
            except (ByHand, PatchError) as exc:
                tried.append((request.kind, _by_hand_text(request, str(exc), originals)))
                request = request.instead
        not_made = [f"{kind} not made: {why}" for kind, why in tried]
        if request is None:  # one edit: why; several: why each
            result.by_hand, result.request = tried[0][1] if len(tried) == 1 else "; ".join(not_made), None
            continue
        if tried:
            result.request, result.numerics, result.purpose = request, request.numerics, request.purpose
            result.label = "; ".join([request.label, *not_made])
        result.diff = unified_diff(originals[request.file], new, name)
    return originals


def _line_map(old: str, new: str):
    """old line number -> new line number, through the edits between the two texts."""
    ops = difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False).get_opcodes()

    def to_new(line: int) -> int:
        i = line - 1
        for tag, i1, i2, j1, j2 in ops:
            if i1 <= i < i2:
                if tag == "equal":
                    return j1 + (i - i1) + 1
                return j1 + min(i - i1, max(0, j2 - j1 - 1)) + 1
        return line

    return to_new


def combine(results: list[FixResult], originals: dict[str, str], base: str) -> dict[str, str]:
    """The files' texts with every given fix made, one after another; a fix that no longer applies on
    top of the others is dropped, saying why."""
    texts = dict(originals)
    made: set[str] = set()
    for result in results:
        request = result.request
        if request is None or not result.in_patch:
            continue
        # Two rules' fixes may be the same edit (bf16 autocast for speed and for memory): it is made once.
        same = repr((request.kind, request.file, request.line, request.lines, sorted(request.params.items())))
        if same in made:
            continue
        to_new = _line_map(originals[request.file], texts[request.file])
        moved = dataclasses.replace(
            request, line=to_new(request.line) if request.line else 0, lines=tuple(to_new(n) for n in request.lines)
        )
        name = os.path.relpath(request.file, base)
        try:
            new = apply_edit(texts[request.file], moved, name)
            check_compiles(new, name)
        except (ByHand, PatchError) as exc:
            if "already" in str(exc) or "changed nothing" in str(exc):
                continue  # an earlier fix made this one too (num_workers brings persistent_workers)
            result.dropped = f"does not combine with the fixes before it: {exc}"
            continue
        texts[request.file] = new
        made.add(same)
    return texts


def render_patch(header: list[str], originals: dict[str, str], texts: dict[str, str], base: str) -> str:
    """Header lines (``#``-commented; ``git apply`` skips them) and the diff of every changed file."""
    diffs = [
        unified_diff(originals[path], texts[path], os.path.relpath(path, base))
        for path in sorted(texts)
        if texts[path] != originals[path]
    ]
    for path in texts:
        if texts[path] != originals[path]:
            check_compiles(texts[path], os.path.relpath(path, base))
    return "".join(f"# {line}\n" if line else "#\n" for line in header) + "".join(diffs)


def write_patch(path: str | os.PathLike, text: str) -> None:
    target = Path(path)
    if target.is_dir():
        raise PatchError(f"doctor --fix {path}: that is a folder; give the patch file's path, e.g. fixes.patch")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text(target, text)  # replaces a symlink at the path rather than writing through it
