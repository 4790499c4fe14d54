"""``doctor --fix`` / ``--verify``: each finding's fix as an edit of the user's own lines, one reviewable
patch, and the patched script timed against the original.

Modules, one job each: ``model`` (the plain data), ``plan`` (findings -> edit requests), ``table``
(edit kind -> LibCST edit: ``keywords``, ``statements``, ``cadence``, ``attention``; ``cst_tools``
holds what they share), ``patch`` (unified diffs with difflib, the compile check, combining fixes),
``verify`` + ``child`` + ``losses`` (interleaved runs of original and patched, losses compared),
``attach`` (the order of work), ``render`` (terminal and HTML).

Importing this package does not import LibCST; the edits do (``pip install 'turbotrain[fix]'``).
"""

from .model import ByHand, EditRequest, FixReport, FixResult, Verification

__all__ = ["ByHand", "EditRequest", "FixReport", "FixResult", "Verification", "require_libcst"]


def require_libcst() -> None:
    """Fail early, before the script runs, when the edits could not be made."""
    try:
        import libcst  # noqa: F401 - only whether it imports
    except ImportError as exc:
        from ...config import ConfigError

        raise ConfigError("doctor --fix edits your script with LibCST, which is not installed: "
                          "pip install 'turbotrain[fix]' (or pip install libcst)") from exc
